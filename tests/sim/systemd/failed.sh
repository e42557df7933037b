#!/bin/sh
# failed.sh UNIT: record UNIT's failure in /run/sim/failed (OnFailure= of every boot unit). The first failure before
# /run/sim/ready wins: it is the root cause; a unit whose dependency failed (its own Result still "success") is
# skipped, and a failure after ready may be a test's doing. sim.py up and status print the file.
unit=$1
result=$(systemctl show "$unit" -p Result --value)
if [ -e /run/sim/ready ] || [ -e /run/sim/failed ] || [ "$result" = success ]; then exit 0; fi
tmp=/run/sim/failed.$unit
{
  echo "unit $unit failed ($result, exit status $(systemctl show "$unit" -p ExecMainStatus --value)); its journal:"
  journalctl -b -u "$unit" -n 30 --no-pager -o short-iso
} >"$tmp"
ln "$tmp" /run/sim/failed 2>/dev/null  # atomic, and only the first of concurrent failures
rm -f "$tmp"

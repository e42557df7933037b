"""The process on a Spark that lives as long as a run's connection, found in shell, written once.

The run lock (operations/run_lock.py) records it so a later run can tell a lock whose run is gone (the background
streams are systemd units and outlive their run: operations/streams). It is the ssh session's own
process (sshd, sshd-session on newer OpenSSH, dropbear); without one (Tailscale SSH serves each command from its
daemon), the outermost ancestor of the shell below init. Never pid 0.
"""

# sh functions: a process's start time (field 22 of /proc/<pid>/stat) and its parent (field 4); the fields are
# counted after the last ')', as the name in field 2 may hold spaces and parentheses
STAT_FUNCTIONS = ("stat_field() { sed 's/.*) //' /proc/$1/stat 2>/dev/null | awk -v n=$2 '{print $(n - 2)}'; }; "
                  "start_of() { stat_field $1 22; }; ")

# sets $p to the session's process (needs STAT_FUNCTIONS before it)
FIND_SESSION = ('p=$$; top=$$; while [ "$p" -gt 1 ]; do case "$(cat /proc/$p/comm 2>/dev/null)" in '
                'sshd|sshd-session|dropbear) break;; esac; top=$p; p=$(stat_field $p 4); [ -n "$p" ] || p=1; '
                'done; [ "$p" -gt 1 ] || p=$top')

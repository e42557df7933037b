#!/bin/sh
# No kernel nfsd here: nfs-server.service only (re)loads the export table through the exportfs stand-in, so the
# deploy's export is checked as state (the file, `exportfs -v`), never mounted.
cat > /etc/systemd/system/nfs-server.service <<'UNIT'
[Unit]
Description=NFS server (simulation: export table only, no kernel nfsd)

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/exportfs -r
ExecStop=/usr/local/bin/exportfs -au

[Install]
WantedBy=multi-user.target
UNIT

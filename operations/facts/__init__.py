"""Read-only facts sparkfold's operations decide from, grouped by subject: files, host, docker, network, systemd,
gpu, nfs, model. Every fact exits 0; a tool it needs is declared with requires_command (missing: its default)."""

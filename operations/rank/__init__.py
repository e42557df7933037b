"""The rank plan: each rank's container spec, the flag check, the pure pair plan, the shell that starts and stops a
rank, and the API wait and smoke test (serving)."""

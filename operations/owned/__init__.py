"""Files and systemd units sparkfold owns on a Spark: put only when they differ, never over a file it does not own."""

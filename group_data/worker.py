# Values for the worker (rank 1: follows rank 0 over the CX7 link).
# Any setting from all.py may be overridden here for the worker only.
role = "worker"  # which Spark this is
rank = 1  # tensor-parallel rank of this Spark
disk_need_gb = 310  # Engram tables + rank 1's weight file (GB)

# Values for the head (rank 0: serves the API, downloads, builds, exports the cache).
# Any setting from all.py may be overridden here for the head only.
role = "head"  # which Spark this is
rank = 0  # tensor-parallel rank of this Spark
disk_need_gb = 505  # checkpoint + Engram tables + both weight files (GB)

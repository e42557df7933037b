"""The guarded netplan apply (an apply the Spark undoes by itself unless a new ssh connection confirms it)."""

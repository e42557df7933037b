"""The network parts steps share: the guarded netplan apply and the head's ssh to the worker."""

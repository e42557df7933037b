# pyinfra run configuration: the two ranks are a pair, so a failure on either Spark stops the run.
from pyinfra import config

config.FAIL_PERCENT = 0
config.REQUIRE_PYINFRA_VERSION = "~=3.10"
config.CONNECT_TIMEOUT = 20

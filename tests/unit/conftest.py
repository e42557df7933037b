import pytest

from operations.validate.client import KEY_VARIABLES, URL_VARIABLES


@pytest.fixture(autouse=True)
def _no_server_from_the_shell(monkeypatch):
    """The validator reads its server and key from these variables: a developer's exported OPENAI_BASE_URL must not
    steer the unit tests."""
    for name in (*URL_VARIABLES, *KEY_VARIABLES):
        monkeypatch.delenv(name, raising=False)

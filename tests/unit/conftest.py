import pytest

from operations.validate.client import KEY_VARIABLES, URL_VARIABLES


@pytest.fixture(autouse=True)
def _no_server_from_the_shell(monkeypatch):
    """The validator reads its server and key from these variables: a developer's exported OPENAI_BASE_URL must not
    steer the unit tests."""
    for name in (*URL_VARIABLES, *KEY_VARIABLES):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _settings_read_afresh():
    """A process reads the saved Hugging Face token and the API key file once (operations/settings/sources.py): each
    test starts without what an earlier one read, so a test that changes them sees its own."""
    from operations.settings.sources import forget_local_reads
    forget_local_reads()
    yield
    forget_local_reads()

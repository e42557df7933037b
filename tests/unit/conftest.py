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


@pytest.fixture(autouse=True)
def _pyinfra_context_as_found():
    """pyinfra's ctx_*.use() sets nothing back when its block raises: a test whose operation raised would leave its
    state (and the facts kept per state, operations/util/fact_reuse.py) to the tests after it."""
    from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state
    found = [(ctx, ctx.get()) for ctx in (ctx_state, ctx_inventory, ctx_config, ctx_host)]
    yield
    for ctx, value in found:
        ctx.set(value)

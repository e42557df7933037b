"""`python -m operations.settings`: every setting, the environment variables that set it, its default and meaning."""

import runpy

from operations.settings.model import SETTING_NAMES
from operations.settings.sources import ALL_PY, env_names, meanings


def main() -> None:
    defaults = runpy.run_path(str(ALL_PY))
    meaning = meanings()
    for name in SETTING_NAMES:
        print(f"{name:22} {' '.join(env_names(name)):40} {defaults.get(name)!r:>12}  {meaning.get(name, '')}")


if __name__ == "__main__":
    main()

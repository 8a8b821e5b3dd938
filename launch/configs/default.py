"""The default run config as a config file (`--config=launch/configs/default.py`): ebrl/defaults.py."""

from ebrl.defaults import get_config  # pylint: disable=unused-import

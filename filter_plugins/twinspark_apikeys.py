"""Ansible filters over twinspark.apikeys: the head's accepted API keys as the digests file the patched vLLM rereads.

The rules live in the Python package (python_tools/twinspark/apikeys.py); these filters only adapt Ansible's
variables to it. The package is imported from this checkout's python_tools/ when it is not installed on the
controller.
"""

from __future__ import annotations

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().with_name("_pythonpath") / "__init__.py"))  # python_tools/ on sys.path

from twinspark import api, apikeys, envfile


def twinspark_api_keys(env):
    """The API keys an env mapping serves with (VLLM_API_KEY's, else DSPARK_API_KEYS'), in order."""
    return api.keys(env or {})


def twinspark_env_text_keys(text):
    """The API keys an env file's text serves with (a node's secrets.env as read back), in order."""
    return api.keys(envfile.parse(text or "").values)


def twinspark_api_key_digests(keys):
    """The digests file's text for these keys, each once, in order."""
    return apikeys.render(list(keys))


class FilterModule:
    def filters(self):
        return {
            "twinspark_api_keys": twinspark_api_keys,
            "twinspark_api_key_digests": twinspark_api_key_digests,
            "twinspark_env_text_keys": twinspark_env_text_keys,
        }

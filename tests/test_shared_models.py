"""The shared models are never written: each file listed in ``../shared/models/README.md`` still has the
sha256 listed there (the session's start and end are compared too: ``tests/conftest.py``)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.models import MODELS, sha256


def test_the_shared_models_have_the_sha256_their_readme_lists():
    readme = MODELS / "README.md"
    if not readme.is_file():
        pytest.skip(f"{readme} not found: put ../shared/models beside the checkout or set RUNNER_SHARED_MODELS")
    listed = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})\s+(\S+)$", readme.read_text(), re.M))
    assert listed, "the README lists no sha256"
    assert {name: sha256(MODELS / name) for name in listed} == listed

"""The policy pack `pulumi preview --policy-pack policy` runs. Constructing it serves forever."""

import sys
from pathlib import Path

# The CLI runs this file from the pack's directory with the pack's own venv; make the sibling
# modules importable however it is started.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pulumi_adapter import PACK_NAME, build_policies
from pulumi_policy import EnforcementLevel, PolicyPack

PolicyPack(name=PACK_NAME, enforcement_level=EnforcementLevel.MANDATORY, policies=build_policies())

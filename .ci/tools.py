"""Which external tools this machine gives the suite (printed by .ci/run before the tests): a test that needs
one skips without it, except the rehearsal's, which DORYLUS_REQUIRE_TERRAFORM=1 (set by .ci/run) makes fail."""

import os
import shutil

from dorylus_py import cgroups
from dorylus_py.errors import ConfigError
from dorylus_py.lab.network import unavailable as lab_unavailable
from dorylus_py.rehearsal.terraform import find_aws_cli, find_tools

try:
    terraform, mirror = find_tools()
    print(f"tools: terraform {terraform}, provider mirror {mirror}, AWS CLI {find_aws_cli()}")
except ConfigError as e:
    print(f"tools: {e}")
print(f"tools: checkov {os.environ.get('CHECKOV') or shutil.which('checkov') or 'absent (its test skips)'}")
print(f"tools: lab namespaces {lab_unavailable() or 'available'}")
print(f"tools: cgroups {cgroups.unavailable() or 'available'}")

"""For the tools and habits that look for setup.py (`pip install -e .` works with or without it).

The configuration is pyproject.toml's; setuptools' PEP 517 backend runs this file on every build.
"""

import warnings

from setuptools import setup
from setuptools.warnings import InformationOnly

# An editable install maps nmt_cli onto cli/ with an import hook, and setuptools then always emits
# an InformationOnly notice ("Editable installation. Please be careful with folders in your working
# directory...") that pip prints as a warning on every `pip install -e .`. It reports nothing wrong;
# real packaging warnings still print (tests/test_packaging.py fails on any).
warnings.filterwarnings("ignore", category=InformationOnly)
setup()

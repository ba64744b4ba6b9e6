"""``python -m featurelake.cli``: the same as the ``featurelake`` command."""
from featurelake.cli import main

main()

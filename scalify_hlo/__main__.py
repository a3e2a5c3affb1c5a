"""`python -m scalify_hlo` is the `scalify-hlo` command."""

from scalify_hlo.cli import main

main()

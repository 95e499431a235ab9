"""Applications built on plugrad (each a subpackage runnable with `python -m plugrad.apps.<name>`)."""

"""Unit tests: nothing but the package (no model download, no server, no browser); kernels run under Triton's
interpreter here and compile for sm_90 where ptxas exists. With importers/, the `make test-fast` lane."""

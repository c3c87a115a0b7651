"""BuildContext: the hard zone, soft-zone candidates from every source, fastpath selection, render."""

"""A table's sweep as a whole, over the configs: checked before its first job (`check`), its stage graph planned without running it (`plan`)."""

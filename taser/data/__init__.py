"""Readers and writers for the ecosystem's formats (DPR, SQuAD, BEIR) and batching."""

import csv
import sys

# DPR's TSV fields (passage texts, answer lists) can exceed csv's default 128 KB field limit.
csv.field_size_limit(sys.maxsize)

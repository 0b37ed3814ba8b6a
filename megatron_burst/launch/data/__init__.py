"""`megatron-burst data`: Megatron's indexed datasets written from JSONL text.

- ``dataset``: a JSONL corpus in, ``PREFIX.bin/.idx`` out (``tokenize_jsonl``);
  ``corpus`` reads the text; ``error`` is the one error type of them all;
- ``sample``: the sample corpus and its tokenizer, made offline (``--sample-corpus``);
- ``commit``: a version switched in by one link, so a reader sees a whole dataset;
  ``lock``: one run per prefix at a time; ``staging``: the sample's other files, written
  whole or not at all.
"""

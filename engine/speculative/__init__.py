"""Speculative decoding: drafts from what the cache and the request already hold, verified in the
ragged batch (1 + k query tokens per speculating sequence), accepted token by token.

  config.py        SpecConfig: mode (off | ngram | cache) and the draft length bound
  prompt_lookup.py the request's own prompt and output as n-gram drafts
  proposer.py      the draft sources of one sequence, best first (tree, own tokens, suffix index)
  draft_length.py  how long a sequence's next draft is: as many tokens as are expected to pay
  step_cost.py     a decode step's time as fixed + per_row * rows, fitted online
  speculator.py    drafting before the forward, verification after it
  stats.py         SpecStats counters
"""

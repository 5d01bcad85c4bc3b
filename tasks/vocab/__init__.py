"""vocab stage: VoCAP (Zheng et al. 2021) — per-language capacity measured by
ALP, allocated under one budget, merged into one SentencePiece unigram model.

    run.py       what the flow calls: :func:`language_grid` (one language's SentencePiece grid),
                 :func:`compose` (VoCAP's allocation, the merged tokenizer, the report), :func:`no_text_error`
    train.py     SentencePiece training: a language's sample, its grid, the joint baseline
    alp.py       ALP (:func:`average_log_probability`), :func:`concave_curve`, :func:`evaluate_tokenizer`
    allocate.py  :func:`allocate_vocabulary`, the budget split across languages
    merge.py     the merged model's pieces and scores
    contract.py  the output contract: file names and the tokenizer's readers
    specials.py  the special tokens' ids

Names are re-exported on first use: importing the package (as the training ranks do, for
contract.py's readers) loads neither sentencepiece nor polars.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {"allocate_vocabulary": "xylent.tasks.vocab.allocate", "average_log_probability": "xylent.tasks.vocab.alp",
         "concave_curve": "xylent.tasks.vocab.alp", "evaluate_tokenizer": "xylent.tasks.vocab.alp",
         "compose": "xylent.tasks.vocab.run", "language_grid": "xylent.tasks.vocab.run"}
__getattr__, __all__ = on_first_use(__name__, _HOME)

"""Text around the token ids: incremental detokenizing, stop strings (the text stage), chat
templates and the logprob rows returned to users.
"""

"""The hash-guarded SGLang `deepseek_v2.py` hidden-state dump patch: hash table, marked blocks,
apply/revert, helper install, pristine-file fetch. Standard library only (runs anywhere)."""

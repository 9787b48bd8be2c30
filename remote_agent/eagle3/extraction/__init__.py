"""Hidden-state extraction: the SGLang client (`--server`), the HF reference extractor
(`--backend hf`) and `verify-dumps`; all write/read the one dense format (`eagle3/dense.py`)."""

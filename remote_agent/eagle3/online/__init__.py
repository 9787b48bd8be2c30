"""Online training: hidden states streamed from the patched SGLang server (or the HF reference
producer) straight into the trainer, no dump on disk. stream_wire.py (shared with the hook) is
the wire format; listener.py the trainer's end; source.py the data pipeline; producer.py the
reference producer; placement.py the one-box memory check."""

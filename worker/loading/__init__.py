"""Where weights come from: HF safetensors folders, `load_format="dummy"` (real shapes, random
weights) and the embedded checkpoints (`tiny-random`). Produces a config, a tokenizer and tensors
for models/; knows nothing of the engine.
"""

"""Training: one loop for every task (CLIP, classification, causal LM, retrofit fine-tuning), recipes, torchrun
(DDP / FSDP2), atomic checkpoints and exact resume. Part of the application layer: nothing in the library
(ops … models, losses, data) imports it."""

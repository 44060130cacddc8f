"""Evaluation: the benchmarks and metrics the papers report (zero-shot, retrieval, linear probe, few-shot,
robustness, language-model metrics, VQA / POPE / multimodal needle). It may import the library; never ``train``."""

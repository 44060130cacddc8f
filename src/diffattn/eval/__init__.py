"""Evaluation: the benchmarks and metrics the papers report (zero-shot, retrieval, linear probe, few-shot,
robustness, language-model metrics, VQA / POPE / multimodal needle). It may import the library; never ``train``.

    from diffattn.eval import recall_at_k, zero_shot_eval, linear_probe, few_shot, vqa_score, pope_metrics
    from diffattn.eval import perplexity, lambada_accuracy, needle_grid, evaluate, compare

The lm-evaluation-harness model lives in :mod:`diffattn.eval.lm_harness` (imported on demand: it needs lm-eval).
"""

from .classification import DEFAULT_TEMPLATES, classification_metrics, zero_shot_classifier, zero_shot_eval
from .comparison import compare
from .language import lambada_accuracy, needle_grid, needle_prompt, perplexity
from .mmvp import mmvp_eval, read_mmvp
from .probe import few_shot, linear_probe, prototype_accuracy
from .retrieval import recall_at_k
from .robustness import COMMON_CORRUPTIONS, corrupt_images, corruption_table, mean_corruption_error, noise_robustness
from .runner import evaluate
from .text_models import get_text_tokenizer, load_language_model
from .vlm import mmneedle_metrics, normalize_vqa_answer, pope_metrics, vqa_accuracy, vqa_score
from .vlm_bench import evaluate_vlm, image_attention, llava_answerer, needle_predictions, plot_needle_cells

__all__ = [
    "DEFAULT_TEMPLATES", "classification_metrics", "zero_shot_classifier", "zero_shot_eval",
    "lambada_accuracy", "needle_grid", "needle_prompt", "perplexity", "mmvp_eval", "read_mmvp",
    "few_shot", "linear_probe", "prototype_accuracy", "recall_at_k",
    "COMMON_CORRUPTIONS", "corrupt_images", "corruption_table", "mean_corruption_error", "noise_robustness",
    "compare", "evaluate", "get_text_tokenizer", "load_language_model",
    "mmneedle_metrics", "normalize_vqa_answer", "pope_metrics", "vqa_accuracy", "vqa_score",
    "evaluate_vlm", "image_attention", "llava_answerer", "needle_predictions", "plot_needle_cells",
]

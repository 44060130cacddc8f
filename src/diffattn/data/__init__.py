"""Real offline datasets, the formats users bring, tokenizers and transforms.

``diffattn data prepare`` (:mod:`diffattn.app.prepare`; ``make data`` in a source checkout) fetches and prepares the
built-in sets into the data directory (:func:`default_root`: ``$DIFFATTN_DATA``, else a source checkout's ``data/``,
else ``~/.cache/diffattn``); :func:`list_datasets` names them and :func:`get_dataset` reads any of them or a user format
(webdataset shards, CSV, image folder, token memmap). docs/data.md is the card for each set.
:mod:`diffattn.data.synthetic` generates the synthetic retrieval tasks (multi-needle, MQAR) from a seed.
"""

from ._common import SETUP_COMMAND, DatasetNotInstalledError, data_root, default_root, hash_split
from .catalog import DATASETS, USER_FORMATS, DatasetInfo, dataset_info, get_dataset, list_datasets
from .corpora import TextDocuments
from .export import export_webdataset
from .formats import CsvPairs, image_folder, webdataset_pairs
from .images import FASHION_MNIST_CLASSES, CaptionImages, Digits, FashionMNIST, read_idx
from .text import email_to_text, load_spam_assassin, stratified_split
from .tokenizers import GPT2_EOT, TextTokenizer, clip_tokenizer, get_tokenizer, gpt2_tokenizer
from .tokens import TokenMemmap, read_token_meta, tokenize_documents, write_token_memmap
from .transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Corruption,
    classifier_transform,
    clip_transform,
    corruption_names,
    pixel_stats,
)

__all__ = [
    "SETUP_COMMAND", "DatasetNotInstalledError", "data_root", "default_root", "hash_split",
    "DATASETS", "USER_FORMATS", "DatasetInfo", "dataset_info", "get_dataset", "list_datasets",
    "TextDocuments", "FASHION_MNIST_CLASSES", "CaptionImages", "Digits", "FashionMNIST", "read_idx",
    "email_to_text", "load_spam_assassin", "stratified_split",
    "GPT2_EOT", "TextTokenizer", "clip_tokenizer", "get_tokenizer", "gpt2_tokenizer",
    "TokenMemmap", "read_token_meta", "tokenize_documents", "write_token_memmap",
    "CsvPairs", "export_webdataset", "image_folder", "webdataset_pairs",
    "IMAGENET_MEAN", "IMAGENET_STD", "Corruption", "classifier_transform", "clip_transform", "corruption_names",
    "pixel_stats",
]

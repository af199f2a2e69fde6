"""The three model families of the paper's Transformer, each in one record: what it is made
of, the classes that build, train and use it, the server routes it answers and the words
the CLI, the server and the page say of it (config/family.py)."""

from ..config.family import Family, register
from ..models import DecoderLM, EncoderClassifier, EncoderDecoder
from ..tasks.classification import Classification
from ..tasks.language_model import LanguageModelling
from ..tasks.translation import Translation
from .encoder import Encoder
from .language_model import LanguageModel
from .translator import Translator

TRANSLATOR = register(Family(
    name="encoder-decoder", encoder=True, decoder=True, classes=False,
    model=EncoderDecoder, task=Translation, use=Translator, routes=("translate",),
    describes="a translation model (encoder-decoder)", action="translate",
    summary="translation: type a sentence, get its translation"))

LANGUAGE_MODEL = register(Family(
    name="decoder", encoder=False, decoder=True, classes=False,
    model=DecoderLM, task=LanguageModelling, use=LanguageModel,
    routes=("completions", "chat"), describes="a language model (decoder)",
    action="generate", summary="language model: continues your text"))

ENCODER = register(Family(
    name="encoder", encoder=True, decoder=False, classes=True,
    model=EncoderClassifier, task=Classification, use=Encoder,
    routes=("classify", "embeddings"),
    describes="an encoder (a classifier or a sentence encoder)", action="classify",
    summary="classifier: labels your text"))

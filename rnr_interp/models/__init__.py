"""Models: a spec or an object -> a TransformerLens `TransformerBridge`, ready to audit.

Everything comes back as a `LoadedModel` (`loaded.py`): the bridge (HookedTransformer
hook names), the HF model it wraps, the tokenizer, chat template and stop tokens. The
modules, one idea each: `specs.py` (the table from spec to loader), `loaders.py`
(transformers' loaders), `adopt.py` (the user's own model objects, as copies),
`wrap.py` (the bridge and its speed patches), `safety.py` (what an untrusted checkpoint
is checked for), `builtin.py` (the built-in real models' fetch), `tiny.py` (the tiny test models'
table), `environment.py` (device, dtype, cache, memory). This module only re-exports.
"""

from rnr_interp.models.builtin import BUILTIN, SMOLLM2_GGUF, SMOLLM2_WHEEL, smollm2_dir, smollm2_gguf
from rnr_interp.models.environment import DTYPES, cache_dir, machine_memory, resolve_device, resolve_dtype
from rnr_interp.models.errors import ModelSpecError
from rnr_interp.models.loaded import USER_SLOT, LoadedModel, PromptFormat, PromptTooLongError
from rnr_interp.models.safety import CODE_MAP_FILES, refuse_remote_code
from rnr_interp.models.specs import SPEC_KINDS, load_model
from rnr_interp.models.tiny import MAX_TINY_LAYERS, TINY, TINY_ARCHITECTURES, build_tiny, char_tokenizer, tiny_config
from rnr_interp.models.wrap import ALIGNMENT, align_weights, stop_token_ids_of, tokenizer_adds_bos, wrap

__all__ = [
    "ALIGNMENT", "BUILTIN", "CODE_MAP_FILES", "DTYPES", "MAX_TINY_LAYERS", "SMOLLM2_GGUF", "SMOLLM2_WHEEL", "SPEC_KINDS", "TINY",
    "TINY_ARCHITECTURES", "USER_SLOT", "LoadedModel", "ModelSpecError", "PromptFormat", "PromptTooLongError",
    "align_weights", "build_tiny", "cache_dir", "char_tokenizer", "load_model", "machine_memory", "refuse_remote_code",
    "resolve_device", "resolve_dtype", "smollm2_dir", "smollm2_gguf", "stop_token_ids_of", "tiny_config", "tokenizer_adds_bos", "wrap",
]

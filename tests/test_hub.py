"""fairseq's hub interface loads every architecture and translates raw text (Moses + subword-nmt)."""
import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from testing_utils import TINY_ARCHS


@pytest.mark.slow
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_from_pretrained_translates_raw_text(arch, multi30k_bin, tiny_checkpoint):
    hub = ARCH_MODEL_REGISTRY[arch].from_pretrained(
        str(tiny_checkpoint(arch)), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(multi30k_bin),
        bpe="subword_nmt", bpe_codes=str(multi30k_bin.parent / "bpe" / "codes"), tokenizer="moses")
    translations = hub.translate(["A man is riding a bike.", "Two dogs play in the snow."], beam=2, max_len_b=8)
    assert len(translations) == 2 and all(isinstance(t, str) and "@@" not in t for t in translations)
    assert type(hub.models[0]) is ARCH_MODEL_REGISTRY[arch]

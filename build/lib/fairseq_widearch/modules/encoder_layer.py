"""Base class of the plugin's encoder layers."""
import torch.nn as nn


class EncoderLayer(nn.Module):
    """An encoder layer that fairseq's ``TransformerEncoderBase`` can load: the encoder calls
    ``upgrade_state_dict_named`` on every layer, and these layers have no legacy names to rename."""

    def upgrade_state_dict_named(self, state_dict, name):
        """No-op: there are no pre-fairseq-0.9 checkpoints of these layers."""

"""The layers of ``tp.nn`` (one file per family; ``module.py`` holds the ``Module`` base class)."""
from .module import Module, RemovableHandle
from .linear import Identity, Linear, Bilinear, LazyLinear, Flatten, Unflatten
from .activation import (ReLU, ReLU6, LeakyReLU, ELU, GELU, SiLU, Mish, Tanh, Sigmoid, Softplus, Softmax, LogSoftmax,
                         Hardtanh, PReLU, Softsign, Tanhshrink, SELU, CELU, Threshold, Hardshrink, Softshrink, GLU,
                         RReLU, LogSigmoid, Softmin, Hardswish, Hardsigmoid, Softmax2d)
from .normalization import (LayerNorm, RMSNorm, GroupNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d, InstanceNorm1d,
                            InstanceNorm2d, InstanceNorm3d)
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d
from .pooling import (MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d, AdaptiveAvgPool1d, AdaptiveAvgPool2d,
                      AdaptiveMaxPool2d, Upsample, UpsamplingNearest2d, UpsamplingBilinear2d)
from .container import Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict
from .sparse import Embedding
from .loss import (L1Loss, MSELoss, CrossEntropyLoss, NLLLoss, BCELoss, BCEWithLogitsLoss, SmoothL1Loss, HuberLoss,
                   KLDivLoss, MarginRankingLoss, HingeEmbeddingLoss, CosineEmbeddingLoss, SoftMarginLoss,
                   MultiLabelMarginLoss, MultiLabelSoftMarginLoss, MultiMarginLoss, TripletMarginLoss,
                   TripletMarginWithDistanceLoss, PoissonNLLLoss, GaussianNLLLoss, CTCLoss, PairwiseDistance,
                   CosineSimilarity)
from .transformer import (MultiheadAttention, Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)
from .rnn import RNNBase, RNN, LSTM, GRU, RNNCellBase, RNNCell, LSTMCell, GRUCell
from .fold import Unfold, Fold
from .padding import *  # noqa: F401,F403
from .padding import __all__ as _padding_all
from .pixelshuffle import PixelShuffle, PixelUnshuffle

__all__ = [
    "Module", "RemovableHandle", "Identity", "Linear", "Bilinear", "LazyLinear", "Flatten", "Unflatten",
    "ReLU", "ReLU6", "LeakyReLU", "ELU", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Softplus", "Softmax", "LogSoftmax",
    "Hardtanh", "PReLU", "Softsign", "Tanhshrink", "SELU", "CELU", "Threshold", "Hardshrink", "Softshrink", "GLU",
    "RReLU", "LogSigmoid", "Softmin", "Hardswish", "Hardsigmoid", "Softmax2d",
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "UpsamplingNearest2d", "UpsamplingBilinear2d",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
    "Upsample", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "Embedding",
    "L1Loss", "MSELoss", "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "SmoothL1Loss", "HuberLoss",
    "KLDivLoss", "MarginRankingLoss", "HingeEmbeddingLoss", "CosineEmbeddingLoss", "SoftMarginLoss",
    "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "PoissonNLLLoss", "GaussianNLLLoss", "CTCLoss", "PairwiseDistance",
    "CosineSimilarity",
    "MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
    "TransformerDecoder", "Transformer",
    "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
    "Unfold", "Fold",
    "PixelShuffle", "PixelUnshuffle",
] + list(_padding_all)

"""Methods (prvr.methods): backbones, relation detectors, objectives and named recipes."""

from prvr.methods import baseline, objectives, relations  # noqa: F401
from prvr.methods import gmmformer, gmmformer2, msl  # noqa: F401  (MS-SL family recipes)
from prvr.methods.backbones import baseline as _dual_branch  # noqa: F401
from prvr.methods import arl  # noqa: F401

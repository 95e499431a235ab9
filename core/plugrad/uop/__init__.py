"""The UOp IR: nodes, patterns, the rewrite engine and symbolic integer algebra."""
from plugrad.uop.ops import GroupOp, Ops, UOp, UOpSpecError, exec_alu, ucache_compact, ucache_size  # noqa: F401
from plugrad.uop.upat import PatternMatcher, RuleError, UPat  # noqa: F401
from plugrad.uop.rewrite import graph_rewrite, graph_rewrite_map  # noqa: F401
from plugrad.uop.symbolic import (ceildiv, pm_const_fold, pm_symbolic, prod, resolve, sint, smax, smin, ssimplify,  # noqa: F401
                                  sym_infer)

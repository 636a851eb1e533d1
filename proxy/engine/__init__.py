"""promaccel's PromQL engine: what promaccel evaluates itself above the stores' answers, shaped
like Prometheus's promql/engine.go and functions.go and kept vectorised (a node's value is its
answer at every step at once).

    nodes.py         the evaluation tree: one frozen dataclass per node type; its leaves
                     (answers and raw windows) are what the pipeline supplies
    evaluator.py     evaluate(tree, answers, windows, budget): the one walk, one dispatch;
                     evaluate_off_loop: the same in the evaluation thread pool
    kernels.py       TABLE: each function's row (shardplanner/functions.py) joined by name
                     with its kernel
    functions.py     instant-vector functions, one kernel per name (histogram.py)
    windows.py       range functions over raw samples or a subquery's answer
                     (window_codes.py numbers the compiled kernels of window_kernels.py and
                     window_lanes.py; quantile.py has quantile_over_time)
    aggregate.py     aggregations; quantile.py the one quantile()
    binop.py         binary operators (matching.py: vector matching, one step's reference)
    local_ops.py     absent/scalar of merged series, `@` restamping, stretches joined
    stepwise.py      samples on the step grid, scalar arguments per step, rangeEval's output
    errors.py        the error tree (EvalError, DuplicateLabelset, EvalLimit, EvalCancelled)
    work.py          WorkBudget: the deadline, work and series bounds, cancellation
    warmup.py        compile the kernels before serving (`python -m proxy.engine.warmup`)

CrossStore (proxy/pipeline/crossstore.py) decides what runs where and builds the tree; the
engine does no I/O.
"""

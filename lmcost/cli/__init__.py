"""The ``lmcost`` command line: it parses, calls the library, and renders. No cost logic lives here.

One module per command group (``estimate``, ``kv``, ``plan``, ``serve``, ``serve-plan``, ``train``, ``figures``, ``measure``, ``fit``,
``op``, ``catalog``); the typer apps, the output flags and the error handler are in :mod:`lmcost.cli.app`,
the option types and value parsers in :mod:`lmcost.cli.options`. Commands are registered here, in the
order ``lmcost --help`` lists them, each as a :class:`lmcost.cli.app.OnceCommand` (a single-valued option
given twice is refused).
"""

from lmcost.cli import catalog, estimate, figures, fit, kv, measure, op, plan, serve, serve_plan, train
from lmcost.cli.app import OnceCommand, app, clusters_app, gpus_app, main, models_app, op_app

for command in (estimate.estimate, estimate.explain, kv.kv, plan.plan, serve.serve, serve_plan.serve_plan, figures.roofline, figures.report, train.train,
                measure.breakdown, measure.calibrate, fit.fit, measure.profile, measure.validate):
    app.command(cls=OnceCommand)(command)
for group, commands in ((op_app, dict(gemm=op.op_gemm, attention=op.op_attention, rmsnorm=op.op_rmsnorm,
                                      layernorm=op.op_layernorm, elementwise=op.op_elementwise,
                                      collective=op.op_collective)),
                        (clusters_app, dict(list=catalog.clusters_list, show=catalog.clusters_show)),
                        (gpus_app, dict(list=catalog.gpus_list, show=catalog.gpus_show)),
                        (models_app, dict(list=catalog.models_list, show=catalog.models_show))):
    for name, command in commands.items():
        group.command(name, cls=OnceCommand)(command)

__all__ = ["app", "main"]

"""`dorylus predict` and `dorylus export`: using what `dorylus train` left in a run record.

Only the standard library is imported at the top, like the CLI's: the parser stays fast.
"""

from __future__ import annotations

from dorylus_py.cli_parser import command

PREDICT_EPILOG = """\
Outputs (--out):
  FILE.npy   (N, C) float32 class probabilities, one row per vertex in the dataset's order;
             with --embeddings, the (N, H) last hidden layer instead
  FILE.npz   ids (N,), probabilities (N, C) [, embeddings (N, H) with --embeddings]
The dataset is the run's own (config.json's data, side files and split; read only if it still holds
what config.json's checksums say, else pass --data) unless --data names another, which must have the
feature width and class count the model was trained on. The forward pass runs
in this process (a prepared folder is put back together), or with --backend through graph servers,
one per partition of a prepared folder: the training pipeline's evaluation forward, no weight updates.
"""

EXPORT_EPILOG = """\
Formats (--to):
  pyg     a state_dict for a stack of torch_geometric convs (GCNConv, GATConv, SAGEConv), with the
          few settings that build the stack; docs/usage.md shows the lines that load it
  torch   a state_dict of this package's reference module, with the settings that rebuild it
Both are plain tensors, strings and numbers: torch.load(OUT, weights_only=True) reads them.
"""


def add_predict(sub, data) -> None:
    p = command(sub, "predict", "class probabilities (and embeddings) of a trained model for every vertex",
                [data], PREDICT_EPILOG)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run record of `dorylus train`")
    p.add_argument("--data", metavar="PATH", help="dataset to predict on (default: the run's own)")
    p.add_argument("--weights", default="best", choices=("best", "final"),
                   help="best: the best validation epoch's (best_weights.npz, default); final: the last epoch's")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.npy or FILE.npz (see below)")
    p.add_argument("--embeddings", action="store_true", help="also the last hidden layer (the last layer's input)")
    p.add_argument("--backend", choices=("local", "cpu"),
                   help="run the forward pass through graph servers (one per partition of a prepared --data "
                        "folder), the tensor work in emulated Lambdas (local) or in the graph servers (cpu); "
                        "default: in this process")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=_run_predict)


def _run_predict(args) -> int:
    from dorylus_py.api import predict
    from dorylus_py.cli_data import sources_of
    from dorylus_py.inference.predict import check_output, write_predictions

    out = check_output(args.out, args.overwrite)
    result = predict(args.run_dir, args.data, args.weights, args.embeddings, sources_of(args) if args.data else None,
                     args.backend)
    write_predictions(result, out, args.embeddings)
    n, c = result.logits.shape
    accuracy = result.accuracy("test")
    print(f"wrote {out}: {n:,} vertices x {c} class probabilities"
          + (f" and {result.embeddings.shape[1]}-wide embeddings" if args.embeddings else "")
          + f", {args.weights} weights of {args.run_dir}"
          + (f"; test accuracy {accuracy:.4f}" if accuracy == accuracy else ""))
    return 0


def add_export(sub) -> None:
    p = command(sub, "export", "a trained model as a state_dict for torch_geometric's convs or this package's module",
                epilog=EXPORT_EPILOG)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run record of `dorylus train`")
    p.add_argument("out", metavar="OUT.pt", help="where to write it")
    p.add_argument("--to", required=True, choices=("pyg", "torch"), help="pyg or torch (see below)")
    p.add_argument("--weights", default="best", choices=("best", "final"),
                   help="best: the best validation epoch's (default); final: the last epoch's")
    p.add_argument("--overwrite", action="store_true", help="replace OUT.pt if it exists")
    p.set_defaults(run=_run_export)


def _run_export(args) -> int:
    from pathlib import Path

    from dorylus_py.cli_data import check_output_file
    from dorylus_py.inference import load_trained
    from dorylus_py.inference.export import export_dict, save_export

    out = Path(args.out)
    check_output_file(out, args.overwrite)
    exported = export_dict(load_trained(args.run_dir, args.weights), args.to)
    save_export(exported, out)
    what = (f"{len(exported['convs'])} {exported['convs'][0]['class']} layers" if args.to == "pyg"
            else f"the reference {exported['model']} module")
    print(f"wrote {out}: {what}, {args.weights} weights of {args.run_dir} (feature_norm {exported['feature_norm']})")
    return 0

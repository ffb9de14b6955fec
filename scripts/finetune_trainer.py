"""Fine-tune a pape_hub model with transformers' ``Trainer`` on a new label set.

Loads a checkpoint (a folder or Hub repo saved by the transformers face, or a registered timm name such as
``vit_t4_pape`` to start from scratch), replaces the head for the dataset's labels
(``ignore_mismatched_sizes=True``), fine-tunes with the image processor and ``compute_metrics``, saves the result
(model + processor, loadable with or without pape_hub) and classifies a few images with
``pipeline("image-classification")``.

    python scripts/finetune_trainer.py --model outputs/arrows/pape_seed0/hf --dataset imagefolder:/data/pets
    python scripts/finetune_trainer.py --model vit_t4_rope_mixed --dataset hf:cifar10 --image-column img
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification, Trainer, TrainingArguments, pipeline

import pape_hub  # noqa: F401 - registers the Auto classes
from pape_hub.data import build_data
from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification, image_processor_for


class ProcessedImages(torch.utils.data.Dataset):
    """(PIL image, label) pairs -> {"pixel_values", "labels"} through the image processor."""

    def __init__(self, data: torch.utils.data.Dataset, processor) -> None:  # noqa: ANN001
        self.data, self.processor = data, processor

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        image, label = self.data[i]
        pixels = self.processor(images=image, return_tensors="pt")["pixel_values"][0]
        return {"pixel_values": pixels, "labels": label}


def load_model(name: str, labels: list[str], image_size: int | None):
    id2label = dict(enumerate(labels))
    label2id = {v: k for k, v in id2label.items()}
    if name in pape_hub.list_pape_models():  # a fresh model from the timm table
        from pape_hub.models import model_args_for

        args = model_args_for(name)
        if image_size:
            args["img_size"] = image_size
        config = PapeViTConfig.from_core_kwargs(args, timm_architecture=name, id2label=id2label, label2id=label2id)
        return PapeViTForImageClassification(config), image_processor_for(config)
    model = AutoModelForImageClassification.from_pretrained(
        name, num_labels=len(labels), id2label=id2label, label2id=label2id, ignore_mismatched_sizes=True)
    try:
        processor = AutoImageProcessor.from_pretrained(name)
    except (OSError, ValueError):
        processor = image_processor_for(model.config)
    return model, processor


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder / Hub repo, or a registered timm name")
    parser.add_argument("--dataset", required=True, help="hf:NAME or imagefolder:PATH (or cifar:PATH)")
    parser.add_argument("--image-column", default="image")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--output-dir", default="outputs/finetune")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=None, help="fresh models only: the training resolution")
    parser.add_argument("--max-train-samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    probe = build_data(args.dataset, img_size=args.image_size or 224, image_column=args.image_column,
                       label_column=args.label_column)
    model, processor = load_model(args.model, probe.classes, args.image_size)
    train = probe.train
    if args.max_train_samples:
        train = torch.utils.data.Subset(train, range(min(args.max_train_samples, len(train))))

    def compute_metrics(prediction) -> dict:  # noqa: ANN001 - transformers' EvalPrediction
        return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}

    out = Path(args.output_dir)
    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=str(out / "trainer"), num_train_epochs=args.epochs, learning_rate=args.lr,
            per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
            eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True,
            metric_for_best_model="accuracy", save_total_limit=2, remove_unused_columns=False, report_to=[],
            seed=args.seed, logging_steps=10, warmup_steps=0.1, weight_decay=0.05,
        ),
        train_dataset=ProcessedImages(train, processor),
        eval_dataset=ProcessedImages(probe.val, processor),
        compute_metrics=compute_metrics,
    )
    trainer.train()
    metrics = trainer.evaluate()
    final = out / "final"
    trainer.save_model(str(final))
    processor.save_pretrained(str(final))
    classify = pipeline("image-classification", model=str(final), image_processor=str(final))
    samples = [probe.val[i][0] for i in range(min(4, len(probe.val)))]
    predictions = [p[0] for p in classify(samples)]
    result = dict(eval=metrics, predictions=predictions, output=str(final))
    (out / "finetune_results.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()

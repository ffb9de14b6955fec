"""Model testers for transformers' own ``ModelTesterMixin`` / ``ConfigTester`` (run by ``tests/test_host_suites.py``).

This file is copied into a package beside ``test_modeling_common.py`` and ``test_configuration_common.py`` from the
installed transformers' sdist, the way transformers' own ``tests/models/<name>/test_modeling_<name>.py`` sit beside
them; it is not collected by this repository's test run. One test class per face (image, video) and encoding; the
image classes of the encodings in ``PAPE_ENCODINGS`` run the full mixin, as transformers' ViT tests do.
"""

from __future__ import annotations

import os
import unittest

import torch
from transformers.models.auto import modeling_auto

import pape_hub  # noqa: F401 - registers the classes with the Auto mappings
from pape_hub.encodings import encoding_class
from pape_hub.hf import (
    PapeViTBackbone,
    PapeViTConfig,
    PapeViTForImageClassification,
    PapeViTModel,
    PapeViViTConfig,
    PapeViViTForVideoClassification,
    PapeViViTModel,
)

from .test_backbone_common import BackboneTesterMixin
from .test_configuration_common import ConfigTester
from .test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor

#: the mixin finds base and head models by name in transformers' static mappings; run-time registrations are not
#: there, so the test classes add their names while they run (setUpClass) and take them out again
MAPPINGS = {
    "pape_vit": ((modeling_auto.MODEL_MAPPING_NAMES, "PapeViTModel"),
                 (modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES, "PapeViTForImageClassification")),
    "pape_vivit": ((modeling_auto.MODEL_MAPPING_NAMES, "PapeViViTModel"),
                   (modeling_auto.MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES, "PapeViViTForVideoClassification")),
}
#: encodings tested (``PAPE_ENCODINGS=a,b`` narrows it); every encoding by default
PAPE_ENCODINGS = [e for e in os.environ.get("PAPE_ENCODINGS", ",".join(pape_hub.list_encodings())).split(",") if e]


class PapeModelTester:
    """Tiny configs and inputs in the shape the mixin asks for (transformers' ``ViTModelTester`` layout)."""

    def __init__(self, parent: unittest.TestCase, encoding: str, video: bool) -> None:
        self.parent, self.encoding, self.video = parent, encoding, video
        self.batch_size, self.image_size, self.patch_size, self.num_channels = 3, 16, 4, 3
        self.num_frames, self.tubelet = 4, [2, 4, 4]
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size = 32, 2, 4, 37
        self.is_training, self.use_labels, self.type_sequence_label_size = True, True, 5
        tokens = (self.image_size // self.patch_size) ** 2 * (self.num_frames // self.tubelet[0] if video else 1)
        self.seq_length = tokens + 1  # + CLS

    def get_config(self) -> PapeViTConfig:
        common = dict(hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                      num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                      image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                      position_encoding=self.encoding, num_labels=self.type_sequence_label_size)
        if self.video:
            return PapeViViTConfig(**common, num_frames=self.num_frames, tubelet_size=self.tubelet)
        return PapeViTConfig(**common)

    def prepare_config_and_inputs(self) -> tuple[PapeViTConfig, torch.Tensor, torch.Tensor]:
        shape = [self.batch_size, self.num_channels, self.image_size, self.image_size]
        if self.video:
            shape.insert(1, self.num_frames)  # (B, T, C, H, W), as transformers' ViViT
        labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        return self.get_config(), floats_tensor(shape), labels

    def prepare_config_and_inputs_for_common(self) -> tuple[PapeViTConfig, dict[str, torch.Tensor]]:
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}


class PapeModelTestBase(ModelTesterMixin):
    encoding = "ape"
    video = False
    test_resize_embeddings = False  # no token embeddings
    test_torch_exportable = False  # torch.export is tested in this repository's tests/test_conformance.py
    has_attentions = True

    @classmethod
    def setUpClass(cls) -> None:
        for mapping, name in MAPPINGS["pape_vivit" if cls.video else "pape_vit"]:
            mapping["pape_vivit" if cls.video else "pape_vit"] = name

    @classmethod
    def tearDownClass(cls) -> None:
        for mapping, _ in MAPPINGS["pape_vivit" if cls.video else "pape_vit"]:
            mapping.pop("pape_vivit" if cls.video else "pape_vit", None)

    def setUp(self) -> None:
        self.model_tester = PapeModelTester(self, self.encoding, self.video)
        config_class = PapeViViTConfig if self.video else PapeViTConfig
        self.config_tester = ConfigTester(self, config_class=config_class, has_text_modality=False, hidden_size=37,
                                          position_encoding=self.encoding)

    def test_config(self) -> None:
        self.config_tester.run_common_tests()

    @unittest.skip(reason="a vision model: no input embeddings to pass instead of pixels")
    def test_inputs_embeds(self) -> None:
        pass

    def test_model_get_set_embeddings(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)

    def test_model(self) -> None:
        config, pixel_values, labels = self.model_tester.prepare_config_and_inputs()
        model = self.all_model_classes[0](config).eval()
        with torch.no_grad():
            out = model(pixel_values)
        batch, seq, width = self.model_tester.batch_size, self.model_tester.seq_length, self.model_tester.hidden_size
        self.assertEqual(out.last_hidden_state.shape, (batch, seq, width))
        head = self.all_model_classes[1](config).eval()
        with torch.no_grad():
            logits = head(pixel_values, labels=labels)
        self.assertEqual(logits.logits.shape, (batch, self.model_tester.type_sequence_label_size))


class PapeBackboneTestBase(BackboneTesterMixin):
    """transformers' own backbone tests (``BackboneTesterMixin``, as DINOv2's and ViTDet's backbones run them) on
    ``PapeViTBackbone``: out_features / out_indices, channels, feature maps, save and load."""

    encoding = "ape"
    config_class = PapeViTConfig
    all_model_classes = (PapeViTBackbone,)
    has_attentions = True

    def setUp(self) -> None:
        self.model_tester = PapeModelTester(self, self.encoding, video=False)

    def test_feature_maps_are_grids_of_the_hidden_size(self) -> None:
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        config.out_indices = [0, 1, 2]
        model = PapeViTBackbone(config).eval()
        with torch.no_grad():
            maps = model(**inputs).feature_maps
        grid = self.model_tester.image_size // self.model_tester.patch_size
        self.assertEqual([tuple(m.shape) for m in maps], [(self.model_tester.batch_size, 32, grid, grid)] * 3)


def _test_class(encoding: str, video: bool) -> type:
    classes = (PapeViViTModel, PapeViViTForVideoClassification) if video else (PapeViTModel,
                                                                               PapeViTForImageClassification)
    name = f"PapeVi{'Vi' if video else ''}T_{encoding}_ModelTest"
    return type(name, (PapeModelTestBase, unittest.TestCase), dict(encoding=encoding, video=video,
                                                                   all_model_classes=classes))


for _encoding in PAPE_ENCODINGS:
    _cls = type(f"PapeViT_{_encoding}_BackboneTest", (PapeBackboneTestBase, unittest.TestCase),
                dict(encoding=_encoding))
    globals()[_cls.__name__] = _cls
    for _video in (False, True):
        if _video and 3 not in encoding_class(_encoding)[0].supported_ndims:  # e.g. LookHere: images only
            continue
        _cls = _test_class(_encoding, _video)
        globals()[_cls.__name__] = _cls
del _cls, _encoding, _video  # else pytest collects the last class a second time under this name

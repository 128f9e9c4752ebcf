"""TFDS schemas of the CLD ttbar data sets (as the real ones, 3.2.1), writer and reader;
neither side needs TensorFlow."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.data.schema import HIT_FEATURES, PF_FEATURES, TARGET_COLUMNS
from heptstudy.errors import DataError
from heptstudy.stand_ins import write_fault

VERSION = "3.2.1"
CONFIG_NAMES = tuple(str(i) for i in range(1, 11))
HITS_NAME = "cld_edm_ttbar_hits"
PF_NAME = "cld_edm_ttbar_pf"


X_WIDTH = {HITS_NAME: len(HIT_FEATURES), PF_NAME: len(PF_FEATURES)}
Y_WIDTH = len(TARGET_COLUMNS)
FEATURE_KEYS = ("X", "ytarget", "ycand", "genmet", "genjets", "targetjets")
EVENTS_PER_SHARD = 256


@functools.cache
def features_dict(name: str):
    """The TFDS feature dictionary of data set ``name`` (identical to the real data set's)."""
    import tensorflow_datasets as tfds

    return tfds.features.FeaturesDict(
        {
            key: tfds.features.Scalar(dtype=np.float32)
            if width is None
            else tfds.features.Tensor(shape=(None, width), dtype=np.float32)
            for key, width in _widths(X_WIDTH[name]).items()
        }
    )


def _widths(x_width: int) -> dict[str, int | None]:
    """Columns per row of every feature (``None``: a scalar)."""
    return dict(zip(FEATURE_KEYS, (x_width, Y_WIDTH, Y_WIDTH, None, 4, 4), strict=True))


_ERRNO_OF = {os.strerror(code): code for code in errno.errorcode}


@contextlib.contextmanager
def _refused_writes_as_os_errors(path: Path) -> Iterator[None]:
    # ArrayRecord reports a refused write (full disk, ...) as RuntimeError: make it the OSError
    try:
        yield
    except RuntimeError as exc:
        code = next((c for text, c in _ERRNO_OF.items() if f": {text}" in str(exc)), None)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from None


class ArrayRecordDatasetWriter:
    """Examples of one (checked, not yet existing) builder config streamed into ArrayRecord shards
    plus TFDS metadata (``download_and_prepare`` spills past 1 GB through TensorFlow)."""

    def __init__(
        self,
        data_dir: str | Path,
        name: str,
        config: str,
        split_sizes: Mapping[str, int],
        metadata: Mapping[str, Any],
        description: str,
    ) -> None:
        self.name, self.config = name, config
        self.final = Path(data_dir) / name / config / VERSION
        self.tmp = self.final.parent / f"incomplete.{VERSION}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.metadata, self.description = dict(metadata), description
        self._plan = {}
        for split, n in split_sizes.items():
            n_shards = max(1, -(-int(n) // EVENTS_PER_SHARD))
            bounds = np.linspace(0, int(n), n_shards + 1).astype(int)
            self._plan[split] = dict(bounds=bounds, count=0, shard=-1, bytes=0, writer=None)

    def add_serialized(self, split: str, data: bytes) -> None:
        """Append an example already serialised with :func:`features_dict` ``(name)``."""
        from array_record.python.array_record_module import ArrayRecordWriter

        plan = self._plan[split]
        bounds = plan["bounds"]
        if plan["count"] == bounds[plan["shard"] + 1]:  # the first event of the next shard
            self._close(plan)
            plan["shard"] += 1
            name = f"{self.name}-{split}.array_record-{plan['shard']:05d}-of-{len(bounds) - 1:05d}"
            plan["path"] = self.tmp / name
            with _refused_writes_as_os_errors(plan["path"]):
                plan["writer"] = ArrayRecordWriter(str(plan["path"]), "group_size:1")
        with _refused_writes_as_os_errors(plan["path"]):
            plan["writer"].write(data)
        plan["bytes"] += len(data)
        plan["count"] += 1

    @staticmethod
    def _close(plan: dict[str, Any]) -> None:
        writer, plan["writer"] = plan["writer"], None
        if writer is not None:
            with _refused_writes_as_os_errors(plan["path"]):
                writer.close()

    def finish(self) -> None:
        """Close the shards and write the metadata, still under the temporary name."""
        import tensorflow_datasets as tfds
        from tensorflow_datasets.core import dataset_info as dataset_info_lib

        infos = []
        for split, plan in self._plan.items():
            self._close(plan)
            template = tfds.core.ShardedFileTemplate(
                data_dir=self.final,
                dataset_name=self.name,
                split=split,
                filetype_suffix="array_record",
            )
            infos.append(
                tfds.core.SplitInfo(
                    name=split,
                    shard_lengths=[int(x) for x in np.diff(plan["bounds"])],
                    num_bytes=plan["bytes"],
                    filename_template=template,
                )
            )
        identity = dataset_info_lib.DatasetIdentity(
            name=self.name,
            version=tfds.core.Version(VERSION),
            data_dir=str(self.final),
            module_name="heptstudy.data.generate",
            config_name=self.config,
            config_description=f"builder config {self.config}",
        )
        info = tfds.core.DatasetInfo(
            builder=identity,
            description=self.description,
            features=features_dict(self.name),
            metadata=tfds.core.MetadataDict(self.metadata),
            homepage="https://github.com/jpata/particleflow (schema); synthetic events",
        )
        info.set_file_format("array_record")
        info.set_splits(tfds.core.SplitDict(infos))
        fault = write_fault(str(self.final))  # tests: a full disk at the last write
        if fault is not None:
            raise fault
        info.write_to_directory(self.tmp)

    def publish(self) -> None:
        """Rename the finished data set into place (atomic: it appears whole)."""
        self.tmp.rename(self.final)

    def discard(self) -> None:
        """Remove what was written, published or not, and the folders left empty."""
        if self.final.exists() and not self.tmp.exists():  # published: the caller checked that
            self.final.rename(self.tmp)  # the data set did not exist before
        for plan in self._plan.values():
            # a shard left open by the failure being reported: its own error does not matter
            with contextlib.suppress(OSError):
                self._close(plan)
        shutil.rmtree(self.tmp, ignore_errors=True)
        for folder in (self.tmp.parent, self.tmp.parent.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


@dataclasses.dataclass(frozen=True)
class Inputs:
    """How messages name the reader's inputs: as the configuration's keys (the default), or as a
    command's own options where the user gave those (``heptstudy data stats``)."""

    data_dir: str = "--data-dir (or data.data_dir, a notebook's data_dir)"
    dataset: str = "data.dataset"
    configs: str = "data.configs"

    def given(self, field: str, value: Any) -> str:
        """``field`` with the ``value`` the user gave, written as the user would have."""
        name = getattr(self, field)
        if not name.startswith("-"):
            return f"{name}={value!r}"
        if isinstance(value, list | tuple):  # an option of several values: --configs 1 2
            return " ".join([name, *map(str, value)])
        return f"{name} {value!r}"

    def refuse_repeated(self, configs: Sequence[str]) -> None:
        """A builder config named twice would have its events read (or written) twice, as if
        they were others: refused, before any work."""
        configs = [str(c) for c in configs]
        if repeated := sorted({c for c in configs if configs.count(c) > 1}, key=configs.index):
            raise DataError(
                f"{self.given('configs', configs)} names builder config "
                f"{', '.join(map(repr, repeated))} more than once; list each config once: "
                f"{self.given('configs', list(dict.fromkeys(configs)))}"
            )


CONFIG_KEYS = Inputs()
#: The options of `heptstudy data generate` and `heptstudy data stats`.
DATA_OPTIONS = Inputs("--data-dir", "--dataset", "--configs")


def parse_dataset(dataset: str, inputs: Inputs = CONFIG_KEYS) -> tuple[str, str]:
    m = re.match(r"([a-z0-9_]+):(\d+\.\d+\.\d+)$", dataset or "")
    if not m:
        raise DataError(
            f"{inputs.given('dataset', dataset)} is not of the form NAME:VERSION "
            f"(for example {HITS_NAME}:{VERSION}); fix {inputs.dataset}"
        )
    return m.group(1), m.group(2)


def _subdirs(path: Path) -> list[str]:
    return sorted(
        p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "incomplete."))
    )


def _datasets_in(path: Path) -> list[str]:
    """The folders of ``path`` laid out as TFDS data sets (name/config/version/dataset_info.json):
    a directory of anything else is not listed whole."""
    return [d for d in _subdirs(path) if any((path / d).glob("*/*/dataset_info.json"))]


def _locate(data_dir: Path, name: str, config: str, version: str, inputs: Inputs) -> Path:
    gen_hint = (
        f"generate synthetic events with `heptstudy data generate --data-dir {data_dir} "
        f"--events-train N --events-test M --seed S` or point {inputs.data_dir} at a TFDS "
        f"directory that holds {name}"
    )
    if data_dir.exists() and not data_dir.is_dir():
        # "does not exist" would be wrong, and generating into it would fail as well
        raise DataError(
            f"data directory {str(data_dir)!r} is a file, not a folder; give {inputs.data_dir} "
            f"the TFDS data directory: the folder that holds {name}/<config>/{version}/ (or a new "
            "folder for `heptstudy data generate --data-dir DIR` to fill)"
        )
    if not data_dir.is_dir():
        raise DataError(f"data directory {str(data_dir)!r} does not exist; {gen_hint}")
    if not (data_dir / name).is_dir():
        if any(data_dir.glob("*/*/dataset_info.json")):  # the data set's own folder was given
            gen_hint = f"give the folder above it as the data directory: {str(data_dir.parent)!r}"
        held = _datasets_in(data_dir)
        raise DataError(
            f"data set {name!r} not found in data directory {str(data_dir)!r} (TFDS data sets "
            f"there: {held or 'none'}); {gen_hint}"
        )
    configs = _subdirs(data_dir / name)
    if config not in configs:
        raise DataError(
            f"builder config {config!r} of {name} not found under {str(data_dir / name)!r}; "
            f"available configs: {configs or 'none'}; set {inputs.configs} to some of them "
            "or generate the missing config with `heptstudy data generate --configs ...`"
        )
    versions = _subdirs(data_dir / name / config)
    if version not in versions:
        raise DataError(
            f"version {version!r} of {name}/{config} not found; available versions: "
            f"{versions or 'none'}; set {inputs.dataset} to {name}:<one of them>"
        )
    path = data_dir / name / config / version
    if not (path / "dataset_info.json").is_file() or not (path / "features.json").is_file():
        raise DataError(
            f"{str(path)!r} has no dataset_info.json/features.json, so it is not a complete "
            "TFDS data set (an interrupted write?); regenerate it or copy it again"
        )
    return path


class ShardedDataset:
    """Several builder configs (one shard each) of one data set and split as one sequence."""

    def __init__(self, sources: list, files: list, metadata: dict[str, Any], x_width: int) -> None:
        # files: per config, the (path, events) of its ArrayRecord files, to name an unreadable one
        self._sources, self._files, self.metadata, self.x_width = sources, files, metadata, x_width
        self.name, self.split = metadata["name"], metadata["split"]
        self.is_hits = self.name.endswith("_hits")
        self.shard_names = metadata["configs"]
        self.shard_sizes = [len(s) for s in self._sources]
        self._offsets = np.concatenate([[0], np.cumsum(self.shard_sizes)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, index within the shard) of global event ``index``."""
        if not 0 <= index < len(self):
            raise DataError(
                f"event index {index} is out of range for {self.name} {self.split} "
                f"(configs {self.shard_names}, {len(self)} events); use 0..{len(self) - 1}"
            )
        shard = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return shard, index - int(self._offsets[shard])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        shard, local = self.locate(index)
        try:
            raw = self._sources[shard][local]
        except Exception as err:  # the reader's errors have no common type; all mean "unreadable"
            raise self._unreadable(shard, local, err) from None
        ev = {
            key: np.asarray(raw[key], dtype=np.float32).reshape(
                () if width is None else (-1, width)
            )
            for key, width in _widths(self.x_width).items()
        }
        x_names = HIT_FEATURES if self.is_hits else PF_FEATURES
        # a finite sum means every entry is finite: only then skip the element-wise look
        for key, what in (("X", "input feature"), ("ytarget", "target")):
            values = ev[key]
            if np.isfinite(values.sum()) or np.isfinite(values).all():
                continue
            row, col = np.argwhere(~np.isfinite(values))[0]
            names = x_names if key == "X" else TARGET_COLUMNS
            column = names[col] if col < len(names) else f"column {col}"
            raise DataError(
                f"{self._event_name(index)} has a non-finite {what}: {key}[{row}, {col}] = "
                f"{values[row, col]} ({column}); the study does not patch or drop such events: "
                "fix or regenerate the data set"
            )
        if len(ev["ytarget"]) != len(ev["X"]):
            raise DataError(
                f"{self._event_name(index)}: X has {len(ev['X'])} rows but ytarget has "
                f"{len(ev['ytarget'])}; they must match"
            )
        ev["event_index"] = np.int64(index)
        return ev

    def _unreadable(self, shard: int, local: int, err: Exception) -> DataError:
        where, folder = f"{self.name}/{self.shard_names[shard]} {self.split}", "its folder"
        position = local
        for path, count in self._files[shard]:
            if position < count:
                where, folder = f"file {str(path)!r}", repr(str(path.parent))
                break
            position -= count
        return DataError(
            f"{where} cannot be read at its record {position} ({_describe_error(err)}); "
            f"the file is truncated, damaged or missing (event {local} of {self.name}/"
            f"{self.shard_names[shard]} {self.split}). The study does not skip unreadable "
            "events: copy the file again from where the data set came from, or regenerate "
            f"synthetic data (remove {folder}, then run `heptstudy data generate`)"
        )

    def _event_name(self, index: int) -> str:
        shard, local = self.locate(index)
        where = f"{self.name}/{self.shard_names[shard]} {self.split}"
        return f"{where} event {local} (global index {index})"

    def empty_events(self, indices: Sequence[int]) -> list[str]:
        """The events among ``indices`` that hold no hit (element), each named."""
        unique = dict.fromkeys(int(i) for i in indices)
        return [self._event_name(i) for i in unique if len(self[i]["X"]) == 0]

    def lengths(self) -> np.ndarray:
        """Number of hits (elements) of every event, in global index order (reads every event)."""
        return np.array([len(self[i]["X"]) for i in range(len(self))], dtype=np.int64)


def open_dataset(
    data_dir: str | Path,
    dataset: str,
    configs: Sequence[str],
    split: str,
    inputs: Inputs = CONFIG_KEYS,
) -> ShardedDataset:
    """Open ``NAME/CONFIG:VERSION`` for every config in ``configs`` and ``split``; messages name
    the inputs as ``inputs`` says."""
    import tensorflow_datasets as tfds

    name, version = parse_dataset(dataset, inputs)
    data_dir = Path(data_dir).expanduser()
    sources, metas, files, paths = [], [], [], []
    expected = X_WIDTH.get(name)
    configs = [str(c) for c in configs]
    for config in configs:
        path = _locate(data_dir, name, config, version, inputs)
        try:
            builder = tfds.builder(f"{name}/{config}:{version}", data_dir=str(data_dir))
        except Exception as err:  # TFDS raises several types; report them all the same way
            raise DataError(
                f"TFDS could not open {str(path)!r}: {_describe_error(err)}; check that the "
                "directory holds a TFDS data set"
            ) from None
        info = builder.info
        _check_against_folder(info, path, name, config, version)
        if split not in info.splits:
            raise DataError(
                f"split {split!r} not found in {name}/{config}:{version}; available splits: "
                f"{sorted(info.splits)}; use one of them"
            )
        feats = info.features
        if missing := [k for k in FEATURE_KEYS if k not in feats]:
            raise DataError(
                f"{name}/{config}:{version} lacks the features {missing} (it has "
                f"{sorted(feats)}); the study needs {list(FEATURE_KEYS)}"
            )
        x_names = HIT_FEATURES if name == HITS_NAME else PF_FEATURES
        for key, want, what, names in (
            ("X", expected, "input features per row in X", x_names),
            ("ytarget", Y_WIDTH, "target columns", TARGET_COLUMNS),
        ):
            if want is not None and (found := feats[key].shape[-1]) != want:
                raise DataError(
                    f"{name}/{config}:{version} has {found} {what}, expected {want} "
                    f"({', '.join(names)}); this is not the schema the study reads: use a "
                    "matching data set version"
                )
        expected = feats["X"].shape[-1]
        try:
            source = builder.as_data_source(split)
        except Exception as err:
            raise DataError(
                f"{str(path)!r} cannot be read as a random-access data source "
                f"({_describe_error(err)}); the reader needs ArrayRecord files (file_format "
                "array_record): convert the data set with `tfds build --file_format=array_record` "
                "or regenerate it"
            ) from None
        files.append(_shard_files(info.splits[split], path, name, config, version, split))
        sources.append(source)
        metas.append(dict(info.metadata or {}))
        paths.append(str(path))
    metadata = {k: v for k, v in metas[0].items() if k not in ("config", "path")}
    metadata["synthetic"] = any(bool(m.get("synthetic")) for m in metas)
    metadata.update(name=name, version=version, configs=configs, split=split)
    metadata["paths"] = paths  # each config's folder
    return ShardedDataset(sources, files, metadata, expected)


def _describe_error(err: Exception) -> str:
    first = (str(err).splitlines() or [""])[0][:200]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _check_against_folder(info, path: Path, name: str, config: str, version: str) -> None:
    """``dataset_info.json`` names this folder's name, config, version and ArrayRecord files."""
    meta = path / "dataset_info.json"
    said = {"name": info.name, "config": info.config_name, "version": str(info.version)}
    folder = {"name": name, "config": config, "version": version}
    # a writer that does not state a field (no config name, say) is not contradicting the folder
    wrong = [
        f"{k} {said[k]!r} (the folder says {folder[k]!r})"
        for k in said
        if said[k] and said[k] != folder[k]
    ]
    redo = f"regenerate the data set (remove {str(path)!r}, then run `heptstudy data generate`)"
    if wrong:
        raise DataError(
            f"{str(meta)!r} gives {', '.join(wrong)}: it does not describe the folder it is in, "
            f"so {name}/{config}:{version} was not opened. Copy the data set again as a whole "
            f"from where it came from, or {redo}"
        )
    listed = {Path(str(f)).name for s in info.splits.values() for f in s.filepaths}
    present = {f.name for f in path.glob(f"{name}-*.array_record-*")}
    if extra := sorted(present - listed):
        raise DataError(
            f"{str(path)!r} holds {len(extra)} ArrayRecord file(s) that no split of "
            f"{str(meta)!r} lists ({', '.join(extra[:3])}{', ...' if extra[3:] else ''}): its "
            f"splits ({', '.join(sorted(info.splits))}) disagree with the files, so the data set "
            f"was not opened. Copy it again as a whole, or {redo}"
        )


def _shard_files(split_info, path: Path, name, config, version, split) -> list[tuple[Path, int]]:
    """The split's files and event counts, checked by ``dataset_info.json``: truncated ones open."""
    from array_record.python.array_record_module import ArrayRecordReader

    paths, lengths = split_info.filepaths, split_info.shard_lengths
    listed = [(Path(str(f)), int(n)) for f, n in zip(paths, lengths, strict=True)]
    redo = (
        "copy it again from where the data set came from, or regenerate synthetic data (remove "
        f"{str(path)!r}, then run `heptstudy data generate`)"
    )
    if missing := [f.name for f, _ in listed if not f.is_file()]:
        raise DataError(
            f"{name}/{config}:{version} {split} lacks {len(missing)} of its {len(listed)} "
            f"ArrayRecord files listed in {str(path / 'dataset_info.json')!r}: "
            f"{', '.join(missing[:3])}{', ...' if missing[3:] else ''}; {redo}"
        )
    for file, expected in listed:
        found = -1
        try:
            reader = ArrayRecordReader(str(file), "readahead_buffer_size:0")
            found = reader.num_records()
            reader.close()
        except Exception as err:  # the reader's errors have no common type
            if found < 0 or found == expected:  # (closing a cut file fails after its count)
                raise DataError(
                    f"file {str(file)!r} cannot be read ({_describe_error(err)}); it is "
                    f"truncated or damaged. The study does not skip unreadable events: {redo}"
                ) from None
        if found != expected:
            raise DataError(
                f"file {str(file)!r} holds {found} events, but {str(path / 'dataset_info.json')!r}"
                f" lists {expected} for it (shardLengths of split {split!r}): the file is "
                f"truncated or was replaced, or the metadata was edited; {redo}"
            )
    return listed

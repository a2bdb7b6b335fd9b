import numpy as np
import pytest

from dorylus_py.data import Graph, random_split, row_normalized
from dorylus_py.errors import ConfigError, DataError


def make(src, dst, n=4, **over):
    args = dict(
        features=np.ones((n, 3), np.float32),
        labels=np.arange(n) % 2,
        train_mask=np.array([1, 0, 0, 0][:n] + [0] * (n - 4), bool),
        val_mask=np.array([0, 1, 0, 0][:n] + [0] * (n - 4), bool),
        test_mask=np.array([0, 0, 1, 1][:n] + [0] * (n - 4), bool),
    )
    args.update(over)
    return Graph.from_edges(src, dst, args.pop("features"), args.pop("labels"), args.pop("train_mask"),
                            args.pop("val_mask"), args.pop("test_mask"), source="g", **args)


def test_in_edge_csr_sorted_and_coalesced(caplog):
    g = make([1, 2, 2, 3, 0, 0], [0, 0, 0, 3, 1, 1])  # one duplicate (2->0), one self loop (3->3), dup 0->1
    assert g.indptr.tolist() == [0, 2, 3, 3, 3]
    assert g.indices.tolist() == [1, 2, 0]
    src, dst = g.edges()
    assert list(zip(src.tolist(), dst.tolist())) == [(1, 0), (2, 0), (0, 1)]
    assert "dropped 1 self loops and 2 duplicate edges" in caplog.text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(src=[0, 7], dst=[1, 2]), "source vertex id 7 is out of range [0, 4)"),
        (dict(src=[0, 1], dst=[1, -1]), "destination vertex id -1 is out of range"),
        (dict(src=[0, 1, 2], dst=[1, 2]), "3 source ids but 2 destination ids"),
        (dict(labels=np.array([0, 1, 0])), "3 labels but the graph has 4 vertices"),
        (dict(labels=np.array([0, 1, -2, 0])), "label -2 of vertex 2 is out of range"),
        (dict(labels=np.array([0, 1, 5, 0]), num_classes=3), "label 5 of vertex 2 is out of range [0, 3) for 3 classes"),
        (dict(labels=np.array([0, 1, 99, 0])), "labels reach 99 but classes 2..98 have no vertex; renumber the labels to 0..2"),
        (dict(labels=np.array([0, 2, 4, 7])), "classes 1, 3, 5..6 have no vertex"),
        (dict(labels=np.array([0, -1, 0, 1])), "vertex 1 is in the val split but has no label"),
        (dict(features=np.array([[1, np.nan, 0]] * 4, np.float32)), "NaN or infinity (first at vertex 0)"),
        (dict(val_mask=np.array([1, 1, 0, 0], bool)), "train and val masks overlap"),
        (dict(train_mask=np.zeros(4, bool)), "the train split is empty"),
        (dict(test_mask=np.ones(3, bool)), "test_mask has 3 entries but the graph has 4 vertices"),
        (dict(labels=np.zeros(4, int)), "need at least 2 classes"),
    ],
)
def test_validation_names_the_problem(kwargs, message):
    src, dst = kwargs.pop("src", [0, 1]), kwargs.pop("dst", [1, 2])
    with pytest.raises(DataError) as e:
        make(src, dst, **kwargs)
    assert str(e.value).startswith("g: ")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_stray_label_is_an_error_unless_the_class_count_says_so():
    labels = np.array([0, 1, 2, 3, 4, 5, 6, 99] * 2)
    masks = [np.arange(16) % 3 == i for i in range(3)]
    with pytest.raises(DataError, match="classes 7..98 have no vertex; renumber the labels to 0..7"):
        Graph.from_edges([0], [1], np.ones((16, 2), np.float32), labels, *masks, source="g")
    g = Graph.from_edges([0], [1], np.ones((16, 2), np.float32), labels, *masks, num_classes=100, source="g")
    assert g.num_classes == 100  # given explicitly: empty classes are meant


def test_random_split_only_labelled_and_disjoint():
    labels = np.array([0, 1, -1] * 100)
    tr, va, te = random_split(labels, 0.2, 0.3, seed=1)
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert (tr | va | te).sum() == 200 and not (tr | va | te)[labels < 0].any()
    assert tr.sum() == 40 and va.sum() == 60
    assert (random_split(labels, 0.2, 0.3, seed=1)[0] == tr).all()
    with pytest.raises(ConfigError):
        random_split(labels, 0.8, 0.5, seed=1)


def test_row_normalized():
    x = np.array([[1, 3], [0, 0]], np.float32)
    assert row_normalized(x).tolist() == [[0.25, 0.75], [0.0, 0.0]]

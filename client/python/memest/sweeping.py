"""Sweeps (the Sweep RPC): one model under many run configurations in one call, each answered as
estimate() answers it alone, and the request Client.sweep sends."""

from memest import v1
from memest.errors import InvalidArgument, MemestError, from_status
from memest.request import build_model, build_request
from memest.results import Estimate

SWEEP_DOC = """Estimates one model under many run configurations in one call; returns a list with,
for each configuration in order, its memest.Estimate, or the memest.MemestError (NotFound,
InvalidArgument, ...) estimate() would raise for it alone (not raised: the others stand).

        The model as for estimate(); `configs` a list of dicts of estimate()'s run words (batch_size,
        precision, optimizer, checkpoint, device, data_parallel, ...), each over the words given
        here for all of them, e.g.

            client.sweep(preset="gpt2-small", seq=1024, precision="bf16", advice=False,
                         layer_rows=0, configs=[{"batch_size": b, "device": d}
                                                for b in (1, 2, 4, 8) for d in ("l4", "a100-80gb")])

        advice and layer_rows apply to all (a search for what fits wants advice=False and
        layer_rows=0); a word that changes the model (seq, params, ...) belongs here, not in a
        configuration. Configurations that build the same graph share it on the server, so a
        sweep costs less than the estimates one by one. on_result(index, result) is called as each
        arrives. The server refuses more configurations than its --max-sweep-configs (65,536
        unless set) with ResourceExhausted, and the whole sweep honours `timeout` (seconds,
        default 10 minutes): DeadlineExceeded after it.
        """

# Without a timeout, a sweep may take this long (seconds): thousands of estimates, not one.
SWEEP_TIMEOUT = 10 * 60.0
_MODEL_WORDS = ("preset", "model", "params", "seq", "hf_config")  # preset, model: arguments
_REQUEST_WORDS = ("advice", "layer_rows")


def sweep_request(preset=None, model=None, *, configs, **common):
    """The SweepRequest for Client.sweep's arguments, and each configuration's label."""
    from memest.client import request_label  # memest.client imports this module
    if isinstance(configs, dict) or not hasattr(configs, "__iter__"):
        raise InvalidArgument("configs: a list of dicts of estimate()'s run words")
    model_words = {word: common.pop(word) for word in _MODEL_WORDS[2:] if word in common}
    # The model, read once (a config.json, a model file), then given to each configuration.
    message = build_model(preset, model, model_words.get("params"), model_words.get("seq"),
                          model_words.get("hf_config"))
    request = None
    labels = []
    for i, config in enumerate(configs):
        if not isinstance(config, dict):
            raise InvalidArgument("configs[%d]: a dict of estimate()'s run words, got %s"
                                  % (i, type(config).__name__))
        for word in _MODEL_WORDS + _REQUEST_WORDS:
            if word in config:
                raise InvalidArgument("configs[%d].%s: one for the whole sweep, given beside "
                                      "configs" % (i, word))
        try:
            one = build_request(model=message, **{**common, **config})
        except (InvalidArgument, TypeError) as error:
            raise InvalidArgument("configs[%d]: %s" % (i, error)) from None
        if request is None:
            request = v1.SweepRequest(model=message, skip_advice=one.skip_advice)
            if one.HasField("max_layer_rows"):
                request.max_layer_rows = one.max_layer_rows
        request.configs.append(one.config)
        labels.append(request_label(one))
    if request is None:
        raise InvalidArgument("configs: a sweep needs at least one run configuration")
    return request, labels


class SweepCollector:
    """The results of a Sweep call, in order, each handed to on_result as it arrives."""

    def __init__(self, labels, on_result=None):
        self.results = []
        self._labels = labels
        self._on_result = on_result

    def take(self, result):
        index = result.index
        if index != len(self.results):
            raise MemestError("sweep: result %d arrived after %d results" % (index,
                                                                            len(self.results)))
        if result.HasField("estimate"):
            item = Estimate.from_proto(result.estimate, label=self._labels[index])
        else:
            item = from_status(result.error.code, result.error.message)
        self.results.append(item)
        if self._on_result is not None:
            self._on_result(index, item)

#!/bin/bash
# One GPU measurement as one script, on a machine without network, with what `make gpu-carry` staged
# (.devcarry/ and .whl/) copied beside the checkout: bench-gpu's parts in order of value, each in its own
# process under its own time limit, each writing its JSON to $OUT as it measures: a part that fails or runs
# out of time costs only itself. Rehearse it on a CPU first, with a tiny BERT (a minute or two):
#   REHEARSE=1 PYTHON=.venv/bin/python OUT=/tmp/gpu_session bash bench/gpu_session.sh
set -u
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if [ -z "${REHEARSE:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then  # the packages the device image lacks (datasets) or has at another version
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD
fi
if [ -n "${REHEARSE:-}" ]; then export TRITON_INTERPRET=1; fi  # the attention kernel on a CPU: Triton's interpreter
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
log "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tail -1)"
log "$($PY -c 'import torch, transformers, datasets; print("torch", torch.__version__, "transformers", transformers.__version__, "datasets", datasets.__version__)' 2>&1 | tail -1)"
if [ -z "${BATCHES:-}" ] && [ -f .devcarry/batches.pt ]; then
    BATCHES=$PWD/.devcarry/batches.pt  # tokenized here beforehand by make gpu-carry: no device time spent on it
elif [ -z "${BATCHES:-}" ]; then  # tokenized once per call by the first part, read by the others
    BATCHES=/tmp/adaptune_gpu_batches.pt
    rm -f "$BATCHES"
fi
COMMON=(--data-dir .devcarry/data --tokenizer .devcarry/tokenizer --batches-cache "$BATCHES" --batch-sets length_grouped
        ${REHEARSE:+--rehearse})
BUDGET=${BUDGET:-575}  # seconds for the whole call, under the caller's own time limit
part() {  # name, seconds at most (or "rest"), arguments of bench.gpu
    local name=$1 limit=$2 left=$((BUDGET - SECONDS)); shift 2
    if [ "$limit" = rest ] || [ "$limit" -gt "$left" ]; then limit=$left; fi
    if [ "$limit" -lt 20 ]; then log "part $name skipped: $left s left"; return; fi
    log "part $name (at most $limit s): $*"
    timeout --signal=INT --kill-after=10 "$limit" $PY -m bench.gpu --out "$OUT/$name.json" "${COMMON[@]}" "$@" >>"$OUT/log.txt" 2>&1
    local status=$?
    log "part $name ended: exit $status"
    return $status
}
NONE=(--shard "" --shard-groups "")
run_part() {
    case $1 in
    # Where the fused step's time goes at the H100 preset's group size: kernels per step, the device's busy share.
    # (BERT-base only: reading BERT-large's profile took over 40 s on the H100.)
    profile) part profile 60 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --fused-profile 8 \
        --fused-methods adapters64 --fused-masks generator ;;
    # The H100 preset's group, BERT-base and BERT-large adapters, eager: the figure a change to the fused step moves.
    fused8) part fused8 70 --backbones bert-base,bert-large --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-optimizer together --fused-masks generator ;;
    # Runs per GPU-hour on 9 RTE adapter runs: one at a time and fused 8 per group (4 processes side by side
    # were no faster than one at a time on the H100, 2026-11-26).
    shard) part shard 150 --backbones bert-base --variants "" --fused "" --shard 1 --shard-groups 8 --shard-train-rows 640 ;;
    # BERT-large adapters, the MFU goal's group: the solo step and fused 4 and 8, on real lengths and padded to 128.
    large) part large 110 --backbones bert-large --variants now --methods adapters64 --batch-sets length_grouped,padded_128 "${NONE[@]}" --fused 4,8 \
        --fused-methods adapters64 --fused-batch-sets padded_128,length_grouped --fused-optimizer together --fused-masks generator ;;
    # top_k 3 (the top 3 layers stacked per run, never measured fused on a GPU): the solo step and fused 1 and 8, BERT-base.
    topk) part topk 70 --backbones bert-base --variants now --methods top_k3 "${NONE[@]}" --fused 1,8 --fused-methods top_k3 \
        --fused-optimizer together --fused-masks generator ;;
    # The solo step (the baseline on this card) and the fused step at k = 1..16, BERT-base adapters and LayerNorm-only.
    base) part base 110 --backbones bert-base --variants now "${NONE[@]}" --fused 1,4,8,16 --fused-methods adapters64,layernorm \
        --fused-optimizer together --fused-masks generator ;;
    # The whole fused step captured as CUDA graphs (ADAPTUNE_COMPILE=step_graphs, new 2026-11-26): first whether a
    # replay trains as the same step does eagerly (losses, trained tensors), then its speed.
    graphcheck) part graphcheck 80 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --graph-check 8 --fused-methods adapters64 ;;
    # The one-run trainer step (this card's baseline) beside fused 1 and 8, eager and as step graphs, counter masks,
    # BERT-base and BERT-large, on real lengths and padded to 128 (the MFU goal's figure).
    graphs) part graphs 210 --backbones bert-base,bert-large --variants now --methods adapters64 --batch-sets length_grouped "${NONE[@]}" \
        --fused 1,8 --fused-methods adapters64 --fused-batch-sets length_grouped,padded_128 --fused-optimizer together --fused-masks counter \
        --fused-compile eager,step_graphs ;;
    # Runs per GPU-hour on the RTE shard through the real trainer: one at a time, then fused 8 replayed as step graphs.
    shardgraphs) ADAPTUNE_COMPILE=step_graphs ADAPTUNE_DROPOUT_MASKS=counter part shardgraphs 170 --backbones bert-base --variants "" \
        --fused "" --shard 1 --shard-groups 8 --shard-train-rows 640 ;;
    # Where the replayed step's time goes: kernels per step and the device's busy share.
    profilegraphs) part profilegraphs 60 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --fused-profile 8 \
        --fused-methods adapters64 --fused-masks counter --fused-compile step_graphs ;;
    # Step graphs with the counter masks as one kernel each (run_dropout.fused_counter_keep_mask): BERT-base at
    # k = 8 and 16, BERT-large at k = 8 on real lengths and padded to 128.
    graphsfused) part graphsfused 170 --backbones bert-base,bert-large --variants "" "${NONE[@]}" --fused 8,16 --fused-methods adapters64 \
        --fused-batch-sets length_grouped,padded_128 --fused-optimizer together --fused-masks counter --fused-compile step_graphs ;;
    # The RTE shard fused 8 as step graphs through the trainer (its one-at-a-time figure: the call before, same kind).
    shardfused) ADAPTUNE_COMPILE=step_graphs ADAPTUNE_DROPOUT_MASKS=counter part shardfused 60 --backbones bert-base --variants "" \
        --fused "" --shard "" --shard-groups 8 --shard-train-rows 640 ;;
    # The attention kernel (ADAPTUNE_ATTENTION=kernel, new 2026-11-27): each run's counter dropout drawn inside one Triton
    # kernel, the length x length tiles never written out. First whether it computes what eager attention does (one
    # call in bf16: mask bits, output, gradients; a group of 8 trained both ways as step graphs), then its speed beside
    # eager attention as step graphs, BERT-base and BERT-large, real lengths and padded to 128 (the MFU goal's figure).
    attncheck) part attncheck 90 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --attention-check 8 \
        --fused-methods adapters64 --fused-compile step_graphs ;;
    attngraphs) part attngraphs 200 --backbones bert-base,bert-large --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-batch-sets length_grouped,padded_128 --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention eager,kernel ;;
    profileattn) part profileattn 60 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --fused-profile 8 \
        --fused-methods adapters64 --fused-masks counter --fused-compile step_graphs --fused-attention kernel ;;
    # The RTE shard fused 8 as step graphs with the kernel, through the trainer (runs per GPU-hour).
    shardattn) ADAPTUNE_COMPILE=step_graphs ADAPTUNE_DROPOUT_MASKS=counter ADAPTUNE_ATTENTION=kernel part shardattn 100 \
        --backbones bert-base --variants "" --fused "" --shard "" --shard-groups 8 --shard-train-rows 640 ;;
    # The one-run trainer step (this card's baseline, same call) beside the kernel's group at k = 16, BERT-base and BERT-large.
    attnwide) part attnwide rest --backbones bert-base,bert-large --variants now --methods adapters64 --batch-sets length_grouped "${NONE[@]}" \
        --fused 16 --fused-methods adapters64 --fused-batch-sets length_grouped --fused-optimizer together --fused-masks counter \
        --fused-compile step_graphs --fused-attention kernel ;;
    # The dropout kernel (ADAPTUNE_DROPOUT=kernel, new 2026-11-27): each hidden-state dropout site's counter mask drawn
    # and applied in one Triton kernel, no mask written or kept (the compiled mask kernel was 9.7 ms of the 63 ms step
    # of 8 BERT-base runs as step graphs with the attention kernel). First whether it computes what the masks do (calls
    # in bf16: mask bits, values, gradients; a group of 8 trained both ways as step graphs with the attention kernel),
    # then its speed beside the masks, BERT-base and BERT-large, real lengths and padded to 128.
    dropcheck) part dropcheck 130 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --dropout-check 8 \
        --fused-methods adapters64 --fused-compile step_graphs --fused-attention kernel ;;
    dropgraphs) part dropgraphs 200 --backbones bert-base,bert-large --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-batch-sets length_grouped,padded_128 --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-dropout mask,kernel ;;
    # top_k groups at the plan's depths (1,369 of paper_full's 3,202 H100-hours are top_k runs, priced one at a time past
    # top_k 3): the solo step of each, then fused 1 and 8 in the preset's step, BERT-base.
    topkdepths) part topkdepths 170 --backbones bert-base --variants now --methods top_k1,top_k6,top_k11 "${NONE[@]}" --fused 1,8 \
        --fused-methods top_k1,top_k6,top_k11 --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel ;;
    # SQuAD's BERT-large adapter groups (753 of paper_full's 3,202 H100-hours; planned 2 a group at 384 tokens and
    # priced one at a time, no group of that shape measured): the solo step and fused 1, 2 and 4 at 384 tokens, the
    # preset's step, with peak memory (a size that does not fit is recorded so).
    squadlarge) part squadlarge 200 --backbones bert-large --variants now --methods adapters64 --batch-sets padded_384 "${NONE[@]}" \
        --fused 1,2,4 --fused-methods adapters64 --fused-batch-sets padded_384 --fused-optimizer together --fused-masks counter \
        --fused-compile step_graphs --fused-attention kernel ;;
    # The grouped LayerNorm kernel (ADAPTUNE_LAYER_NORM=kernel, new 2026-11-27): each run's trained LayerNorm in one Triton
    # kernel each way, where torch's operators write the normalized input, its scaled copy and two more in the backward
    # pass (29% of a layer's bytes by the census). First whether it computes what torch's operators do (calls at BERT-base
    # width, float32 and bf16; a group of 8 trained both ways in the preset's step).
    lncheck) part lncheck 80 --backbones bert-base --variants "" "${NONE[@]}" --fused "" --layer-norm-check 8 \
        --fused-methods adapters64 --fused-compile step_graphs --fused-attention kernel ;;
    # The levers not yet timed, crossed in the preset's step at k = 8 (the dropout kernel, the LayerNorm kernel; the
    # projections stacked, as the trainers always stack them): BERT-base on real lengths (runs per GPU-hour), BERT-large padded to
    # 128 (the MFU goal's figure). A kernel that failed its check above is left out (DROPOUT_MODES, LAYER_NORM_MODES).
    leversbase) part leversbase 100 --backbones bert-base --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-batch-sets length_grouped --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-dropout "$DROPOUT_MODES" --fused-layer-norm "$LAYER_NORM_MODES" ;;
    leverslarge) part leverslarge 120 --backbones bert-large --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-batch-sets padded_128 --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-dropout "$DROPOUT_MODES" --fused-layer-norm "$LAYER_NORM_MODES" ;;
    # The issue's realistic shard, smaller: RTE, MRPC and CoLA x adapters 64 and LayerNorm-only (54 runs, 1,000 rows
    # each, 3 epochs; a shard per task, in turn) one at a time in the preset's mode and fused 8. The records' time by
    # phase says where each attempt's seconds went (seconds_by_phase).
    shardmix) part shardmix 300 --backbones bert-base --variants "" --fused "" --shard 1 --shard-groups 8 --shard-train-rows 1000 \
        --shard-tasks rte,mrpc,cola --shard-methods adapters64,layernorm ;;
    # The RTE shard fused 8 alone (no one-at-a-time pass), all rows; named twice (shardfused8a shardfused8b) it says how
    # much of a group's eager steps and captures is Triton compiling kernels: the second process finds them in the
    # on-disk cache (~/.triton/cache), as a later shard on the same node would.
    shardfused8*) part "$1" 100 --backbones bert-base --variants "" --fused "" --shard "" --shard-groups 8 ;;
    # Runs per GPU-hour on a realistic shard (9 RTE adapter runs, all of RTE's 2,241 training rows, 3 epochs: 213 steps a
    # run where the short shard's have 60): one at a time in the preset's mode (each a group of one, replayed), then fused 8,
    # the H100 preset's step settings as run_shard sets them (the LayerNorm kernel since 2026-11-27).
    shardfull) part shardfull 170 --backbones bert-base --variants "" --fused "" --shard 1 --shard-groups 8 ;;
    # The same shard one run at a time in the plain trainer (eager, generator masks: the environment overrides the
    # preset's settings), the baseline runs per GPU-hour are counted against.
    shardplain) ADAPTUNE_COMPILE=eager ADAPTUNE_DROPOUT_MASKS=generator ADAPTUNE_ATTENTION=eager ADAPTUNE_LAYER_NORM=torch \
        part shardplain 260 --backbones bert-base --variants "" --fused "" --shard 1 --shard-groups "" ;;
    # What a group's host spends outside its replayed steps (RTE's 9 runs fused as 5 and 4, 640 rows a run: 60 steps),
    # under cProfile: an eager step took about 1.1 s of the host on 2026-11-28 against 36 ms replayed, and 11 of the
    # shard's 40 s were eager steps and captures; its seconds carry cProfile's overhead, so time comes from shardfull.
    shardhost) part shardhost 120 --backbones bert-base --variants "" --fused "" --shard "" --shard-groups 8 --shard-train-rows 640 \
        --shard-host-profile 60 ;;
    # BERT-large's group of 8 in the preset's step (the LayerNorm and dropout kernels), real lengths (the plan's
    # FUSED_SPEEDUP row) and padded to 128 (the MFU goal's figure).
    presetlarge) part presetlarge 90 --backbones bert-large --variants "" "${NONE[@]}" --fused 8 --fused-methods adapters64 \
        --fused-batch-sets length_grouped,padded_128 --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-dropout kernel --fused-layer-norm kernel ;;
    # SQuAD's runs (473 of paper_full's 1,248 H100-hours; its 648 top_k runs priced at the 128-token row scaled to the
    # 185 tokens its batches average, an upper bound; that row scaled to 384 overpriced its adapter runs 2.7x): the trainer's one-run step at SQuAD's own batch lengths (185 tokens on
    # average, squad_lengths), then at 384, adapters 64, top_k at two depths, and full fine-tuning (top_k 24 and the
    # embeddings).
    # `preset` is the same step with the trainer's run dropout under the preset's step settings, as a SQuAD run trains in a
    # pipeline task (counter masks, the attention and dropout kernels); `now` is the plain step every price so far used.
    # Methods in order of value: each is saved as it is measured, so a cut-off part keeps the first ones.
    # How a replayed group's step grows with its tokens: FUSED_SPEEDUP was measured on a mix of CoLA, SST-2, MRPC and RTE
    # batches padded to 39.8 tokens on average, but tasks pad to 15 (CoLA) to 127 (20 Newsgroups) (bench/task_lengths.json),
    # and a step that keeps the device busy grows with them: RTE's shard (72.9 tokens) replayed its steps at about 0.79
    # of the mix's rate on 2026-11-28. A group of 6, BERT-base adapters 64, the full preset, at fixed lengths.
    lengthcurve) part lengthcurve 120 --backbones bert-base --variants "" "${NONE[@]}" --fused 1,6 --fused-methods adapters64 \
        --fused-batch-sets tokens_16,tokens_40,tokens_72,tokens_128 --fused-optimizer together --fused-masks counter \
        --fused-compile step_graphs --fused-attention kernel --fused-dropout kernel --fused-layer-norm kernel ;;
    # Where BERT-large's group of 8 spends its step in the full preset (the dropout and LayerNorm kernels, new since the
    # last profile, which was BERT-base's with the masks): the MFU goal's step. Reading its profile took over 40 s once.
    profilelarge) part profilelarge 150 --backbones bert-large --variants "" "${NONE[@]}" --fused "" --fused-profile 8 \
        --fused-methods adapters64 --fused-masks counter --fused-compile step_graphs --fused-attention kernel --fused-dropout kernel \
        --fused-layer-norm kernel ;;
    # Whether SQuAD's one-run step pays replayed (new 2026-11-28: a span task's loss reads each run's token count from
    # the device, so its step can be captured; run_attempt._graphed_alone still sends 384-token runs to the trainer's
    # step). On 2026-11-27 a replayed group of one took 95.6 ms against the trainer's 83.1 ms, both with every step at 384
    # tokens and the replay with the masks' dropout. But a SQuAD run's batches average 185 tokens (squad_lengths, from
    # make gpu-carry), and the trainer's step is bound by its host below about 384 (76.1 ms at 128): shorter steps should
    # pay replayed. Here at SQuAD's own lengths, with the dropout and LayerNorm kernels, beside the trainer's step under
    # the same environment; then both at 384.
    squadgraphs) ADAPTUNE_DROPOUT_MASKS=counter ADAPTUNE_ATTENTION=kernel ADAPTUNE_DROPOUT=kernel part squadgraphs 200 \
        --backbones bert-large --variants preset --methods adapters64,top_k12 --batch-sets squad_lengths --repeats 1 "${NONE[@]}" \
        --fused 1 --fused-methods adapters64,top_k12 --fused-batch-sets squad_lengths,padded_384 --fused-optimizer together \
        --fused-masks counter --fused-compile step_graphs --fused-attention kernel --fused-dropout kernel --fused-layer-norm kernel ;;
    squadtopk) ADAPTUNE_DROPOUT_MASKS=counter ADAPTUNE_ATTENTION=kernel ADAPTUNE_DROPOUT=kernel part squadtopk 140 --backbones bert-large \
        --variants now,preset --methods adapters64,top_k12,top_k1,full --batch-sets squad_lengths,padded_384 --repeats 1 "${NONE[@]}" \
        --fused "" ;;
    # Full fine-tuning as a group of one (run_groups.GroupedEmbedding, new 2026-11-27: under step graphs a run that trains
    # the whole model now trains so, where it trained in the host-bound trainer's step): its replayed step beside the
    # trainer's, BERT-base and BERT-large, real lengths. 363 of paper_full's 1,757 H100-hours are such runs.
    wholealone) part wholealone 110 --backbones bert-base,bert-large --variants now --methods full --batch-sets length_grouped \
        "${NONE[@]}" --fused 1 --fused-methods full --fused-batch-sets length_grouped --fused-optimizer together --fused-masks counter \
        --fused-compile step_graphs --fused-attention kernel ;;
    # How the preset's step time grows with a group's runs: the plan prices a size between two measured ones on the
    # line between their step times (cost.table_fused_speedup), and paper_full's group keys hold 9, 12 or 15 runs,
    # trained as 5+4, 6+6 and 8+7 at runs_per_group 8; a group of 12 says whether 12 a group would pay.
    groupsizes) part groupsizes 170 --backbones bert-base --variants "" "${NONE[@]}" --fused 1,2,4,6,8,12 --fused-methods adapters64 \
        --fused-batch-sets length_grouped --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-layer-norm kernel ;;
    # The same for top-k 3 (paper_full's 3,012 GLUE top-k runs train in groups of 4 to 6, priced at 8's step time:
    # only 8 was measured for 3 layers), and a lone top-k 3 run replayed.
    topksizes) part topksizes 120 --backbones bert-base --variants "" "${NONE[@]}" --fused 1,4,6 --fused-methods top_k3 \
        --fused-batch-sets length_grouped --fused-optimizer together --fused-masks counter --fused-compile step_graphs \
        --fused-attention kernel --fused-layer-norm kernel ;;
    # Why the compiled counter masks drew other bits than the eager operators on the H100 (2026-11-28): each factor
    # alone (dynamic or static sizes, int32 or int64 draws, one shape or the training sequence), with inductor's code.
    maskcode) local left=$((BUDGET - SECONDS)); if [ "$left" -lt 60 ]; then log "part maskcode skipped: $left s left"; return; fi
        log "part maskcode (at most 60 s)"
        TORCH_LOGS=output_code,recompiles timeout --signal=INT --kill-after=10 60 $PY -m bench.mask_code >"$OUT/maskcode.json" 2>"$OUT/maskcode_code.log"
        local status=$?; gzip -f "$OUT/maskcode_code.log"; log "part maskcode ended: exit $status" ;;
    *) log "no part $1" ;;
    esac
}
# The default queue (2026-11-28): the RTE shard in the preset as it now is (the dropout kernel, one eager step before a
# capture, resume states only as often as they pay; its records say captures' seconds apart from eager steps'), the
# plain trainer's on the same card (it ran past 200 s on 2026-11-28: 212-242 s), and SQuAD's top_k step at its own
# lengths (198 of paper_full's 1,248 H100-hours, an upper bound from the 128-token row; unmeasured).
# A second call: PARTS='shardhost presetlarge lengthcurve squadgraphs profilelarge' (the budget cuts what does not fit);
# then 'maskcode topksizes shardmix'.
# Other parts (shardhost, squadgraphs, profilelarge, lengthcurve, dropcheck, groupsizes, wholealone, presetlarge, shardfused8a,
# shardfused8b, lncheck, leversbase, leverslarge, topkdepths, dropgraphs, squadlarge, attncheck, attngraphs,
# attnwide, profileattn, shardattn, graphcheck, graphs, shardgraphs, profilegraphs, graphsfused, shardfused, shard, base, topk,
# profile, fused8, large) stay for later calls: PARTS="..." picks them. (The parts that timed only options since removed, the
# compiled modes, the projections separate, the bf16 residual stream, the sums in the matmuls, the graph warm-up setting and
# whole models stacked a group, went with them: bench/README.md keeps their figures.)
# A kernel that fails its check outright (not for time: exit 124) is left out of the parts after it; if the attention
# kernel fails, the call goes on to FALLBACK's parts (by default the step graphs with eager attention), so that one failed
# compile on the device's Triton does not cost the whole call.
DROPOUT_MODES=${DROPOUT_MODES:-mask,kernel}
LAYER_NORM_MODES=${LAYER_NORM_MODES:-torch,kernel}
queue=(${PARTS:-shardfull shardplain squadtopk})
while [ ${#queue[@]} -gt 0 ]; do
    name=${queue[0]}; queue=("${queue[@]:1}")
    run_part "$name"; status=$?
    if [ "$name" = attncheck ] && [ $status -ne 0 ] && [ $status -ne 124 ]; then
        log "the attention kernel failed its check: on to ${FALLBACK:-graphs graphsfused}"
        queue=(${FALLBACK:-graphs graphsfused})
    elif [ "$name" = dropcheck ] && [ $status -ne 0 ] && [ $status -ne 124 ]; then
        log "the dropout kernel failed its check: the parts after it leave it out"
        DROPOUT_MODES=mask
    elif [ "$name" = lncheck ] && [ $status -ne 0 ] && [ $status -ne 124 ]; then
        log "the LayerNorm kernel failed its check: the parts after it leave it out"
        LAYER_NORM_MODES=torch
    fi
done
log "done"

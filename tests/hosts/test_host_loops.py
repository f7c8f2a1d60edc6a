"""The hosts' own training loops, end to end on the tiny models, as a user runs them:
transformers' Trainer with gradient accumulation, DataLoader workers, evaluate() and a resume
mid-epoch (with mmpipe's token-budget sampler as its batch sampler); trl.SFTTrainer on an encoded
dataset it was not told to leave alone (refused by name, not blamed on the encoding); and
VisionGRPOTrainer's reward functions, which get each row's images as stock TRL gives them."""

from __future__ import annotations

import datasets
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError
from mmpipe.hosts import TrainerCollator, trainer_settings

from conftest import processor_for


def sft_rows(n: int) -> list[dict]:
    """Chat rows with 0, 1 or 2 small images, texts of varied length."""
    rows = []
    for i in range(n):
        k = i % 3
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"What is in picture {i}?" + " x" * (i % 4)}]
        rows.append({"messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}." + " y" * i}]}],
                     "images": [testing.tiny_image(36 + 8 * j, 44 + 4 * i, seed=7 * i + j) for j in range(k)]})
    return rows


@pytest.fixture(scope="module")
def enc():
    enc, report = mmpipe.encode_dataset(datasets.Dataset.from_list(sft_rows(8)), processor_for("qwen2_vl"))
    assert report.rows_out == 8
    return enc


def forwards(model) -> list[dict]:
    """Every forward's tensor kwargs, as the model received them."""
    calls: list[dict] = []
    model.register_forward_pre_hook(
        lambda m, a, kw: calls.append({k: v.detach().clone() for k, v in kw.items() if torch.is_tensor(v)}),
        with_kwargs=True)
    return calls


def token_mean_loss(model, batches) -> float:
    """The causal-LM loss over all target tokens of ``batches`` together (what gradient
    accumulation with ``num_items_in_batch`` optimises)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for b in batches:
            kw = {k: v for k, v in b.items() if k != "num_items_in_batch"}
            logits = model(**kw).logits[:, :-1].float()
            labels = kw["labels"][:, 1:]
            total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                             ignore_index=-100, reduction="sum"))
            n += int((labels != -100).sum())
    return total / n


def test_trainer_accumulation_workers_and_evaluate(enc, tmp_path):
    """gradient_accumulation_steps=2 x batch 2 with 2 DataLoader workers (the collator pickled):
    each micro-batch reaches the model with its pixels, the logged loss is the token mean over
    both micro-batches, evaluate()'s loss is the mean of its batches' forward losses."""
    proc = processor_for("qwen2_vl")
    model = testing.build_model("qwen2_vl")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    calls = forwards(model)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1,
                             per_device_eval_batch_size=2, dataloader_num_workers=2, learning_rate=1e-2, logging_steps=1,
                             report_to=[], save_strategy="no", seed=0, use_cpu=True, **trainer_settings())
    trainer = Trainer(model=model, args=args, train_dataset=enc, eval_dataset=enc, data_collator=TrainerCollator(proc))
    trainer.train()
    train_calls = list(calls)
    assert len(train_calls) == 2 and all("pixel_values" in c and c["position_ids"].shape[0] == 3 for c in train_calls)
    fresh = testing.build_model("qwen2_vl")
    fresh.load_state_dict(start)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert abs(logged[0] - token_mean_loss(fresh, train_calls)) < 1e-5
    del calls[:]
    metrics = trainer.evaluate()
    eval_calls = list(calls)  # the check's own forwards below also pass the hook
    assert len(eval_calls) == 4
    with torch.no_grad():
        want = sum(float(trainer.model(**c).loss) for c in eval_calls) / len(eval_calls)
    assert abs(metrics["eval_loss"] - want) < 1e-5


def test_trainer_resume_with_token_budget_sampler_same_batches(enc, tmp_path):
    """TokenBudgetBatchSampler as the Trainer's batch sampler: resume_from_checkpoint after 3
    steps (mid-epoch) trains on exactly the batches an uninterrupted run takes from step 4 on."""
    proc = processor_for("qwen2_vl")

    class BudgetTrainer(Trainer):
        def get_train_dataloader(self):
            sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(enc, max_tokens=160, seed=3)
            return self.accelerator.prepare(DataLoader(enc, batch_sampler=sampler, collate_fn=TrainerCollator(proc)))

    def run(steps, resume=None):
        model = testing.build_model("qwen2_vl")
        calls = forwards(model)
        args = TrainingArguments(str(tmp_path), max_steps=steps, save_strategy="steps", save_steps=3, learning_rate=1e-2,
                                 report_to=[], seed=0, use_cpu=True, **trainer_settings())
        BudgetTrainer(model=model, args=args, train_dataset=enc).train(resume_from_checkpoint=resume)
        return [[tuple(ids[m.bool()].tolist()) for ids, m in zip(c["input_ids"], c["attention_mask"])] for c in calls]

    assert len(mmpipe.TokenBudgetBatchSampler.from_dataset(enc, max_tokens=160, seed=3)) > 3  # step 3 is mid-epoch
    full = run(6)
    resumed = run(6, resume=str(tmp_path / "checkpoint-3"))
    assert len(full) == 6 and len(resumed) == 3
    assert resumed == full[3:]
    assert len({row for batch in full[:4] for row in batch}) == sum(len(b) for b in full[:4])  # no row twice in epoch


def test_sft_trainer_truncating_encoded_rows_is_refused_by_name(enc, tmp_path):
    """SFTConfig without skip_prepare_dataset: TRL truncates input_ids/labels to max_length (and
    drops rows with no target left) while the other columns keep their length; the collator
    names the setting instead of asking to re-encode the rows."""
    from trl import SFTConfig, SFTTrainer

    proc = processor_for("qwen2_vl")
    short = min(len(x) for x in enc["input_ids"])
    args = SFTConfig(str(tmp_path), per_device_train_batch_size=2, max_steps=1, report_to=[], save_strategy="no",
                     use_cpu=True, bf16=False, max_length=short - 2, **trainer_settings())
    trainer = SFTTrainer(model=testing.build_model("qwen2_vl"), args=args, train_dataset=enc, processing_class=proc,
                         data_collator=TrainerCollator(proc))
    assert len(trainer.train_dataset) < len(enc)  # TRL dropped rows whose answer it cut off
    with pytest.raises(ArgumentError, match=r"skip_prepare_dataset.*sft_settings") as e:
        trainer.train()
    assert "attention_mask" in str(e.value)
    # the rows as TRL prepared them, straight into the collator: the same refusal
    cut = dict(enc[0])
    cut["input_ids"], cut["labels"] = cut["input_ids"][:-3], cut["labels"][:-3]
    with pytest.raises(ArgumentError, match="skip_prepare_dataset"):
        TrainerCollator(proc)([dict(enc[1]), cut])


def test_grpo_rewards_receive_each_rows_images(tmp_path):
    """Stock GRPOTrainer passes every dataset column to the reward functions, ``images`` included;
    VisionGRPOTrainer hides the images from TRL's processing, and gives them back to the rewards,
    each completion with its own prompt's images."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"Show {k}."}]}],
             "images": [testing.tiny_image(28 * (2 + j), 56, seed=10 * k + j) for j in range(k)], "k": k}
            for k in range(4)]
    seen = []

    def reward(completions, images, k, **kwargs):
        seen.append((list(k), images))
        return [float(len(im or [])) for im in images]

    args = GRPOConfig(str(tmp_path), per_device_train_batch_size=8, num_generations=2, max_completion_length=4,
                      temperature=1.0, max_steps=1, report_to="none", save_strategy="no", seed=0,
                      gradient_checkpointing=False, **grpo_settings())
    trainer = VisionGRPOTrainer(model=testing.build_model("qwen2_vl"), reward_funcs=reward, args=args,
                                train_dataset=datasets.Dataset.from_list(rows), processing_class=processor_for("qwen2_vl"))
    trainer.train()
    assert len(seen) == 1
    ks, images = seen[0]
    assert sorted(ks) == [0, 0, 1, 1, 2, 2, 3, 3]
    for k, ims, row in zip(ks, images, trainer.last_rollout):
        assert len(ims) == k == row.num_images
        assert [im.size for im in ims] == [(56, 28 * (2 + j)) for j in range(k)]


def test_grpo_generates_from_the_prompt_not_the_answer(tmp_path):
    """SFT-style rows (``messages`` ending with the assistant's answer) and TRL prompt-completion
    rows: the model is sampled after the assistant header of the prompt alone, as stock TRL does
    with ``prompt``; the rewards still read the answer from ``messages``."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    proc = processor_for("qwen2_vl")
    user = lambda k: [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": f"Count {k}."}]}]
    answer = [{"role": "assistant", "content": [{"type": "text", "text": "SECRET answer"}]}]
    images = lambda k: [testing.tiny_image(56, 56, seed=k + j) for j in range(k)]
    rows = [{"messages": user(k) + answer, "images": images(k)} for k in (1, 2)]
    answers = []

    def reward(completions, messages, **kwargs):
        answers.extend(m[-1]["content"][0]["text"] for m in messages)
        return [0.0] * len(completions)

    args = GRPOConfig(str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=3,
                      temperature=1.0, max_steps=1, report_to="none", save_strategy="no", seed=0,
                      gradient_checkpointing=False, **grpo_settings())
    trainer = VisionGRPOTrainer(model=testing.build_model("qwen2_vl"), reward_funcs=reward, args=args,
                                train_dataset=datasets.Dataset.from_list(rows), processing_class=proc)
    trainer.train()
    want = {k: mmpipe.encode_row({"prompt": user(k), "images": images(k)}, proc, labels=False).input_ids.tolist()
            for k in (1, 2)}
    assert len(trainer.last_rollout) == 4 and answers == ["SECRET answer"] * 4
    for row in trainer.last_rollout:
        ids = row.input_ids.tolist()
        assert ids[:len(want[row.num_images])] == want[row.num_images]
        assert proc.decode(want[row.num_images]).endswith("<|im_start|>assistant\n")
    # TRL's prompt-completion rows: the completion is not part of the prompt either
    got = trainer._prompt_row({"prompt": user(1), "completion": answer, "images": images(1)}, 0)
    assert got.input_ids.tolist() == want[1]
    with pytest.raises(ArgumentError, match="only assistant turns"):
        trainer._prompt_row({"messages": answer, "images": []}, 0)


def test_grpo_prompts_render_as_trl_renders_them(tmp_path):
    """TRL renders every prompt with ``apply_chat_template(add_generation_prompt=True,
    **GRPOConfig.chat_template_kwargs)``; VisionGRPOTrainer's raw-row prompts are those ids."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    proc = processor_for("qwen2_vl")
    img = testing.tiny_image(56, 84, seed=4)
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many dots?"}]}
    prefill = {"role": "assistant", "content": [{"type": "text", "text": "Let me count."}]}
    args = GRPOConfig(str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1, report_to="none",
                      chat_template_kwargs={"add_vision_id": True}, **grpo_settings())
    trainer = VisionGRPOTrainer(model=testing.build_model("qwen2_vl"), reward_funcs=lambda completions, **kw: [0.0],
                                args=args, train_dataset=datasets.Dataset.from_list([{"prompt": [user], "images": [img]}]),
                                processing_class=proc)
    for prompt in ([user], [user, prefill]):
        inline = [{**m, "content": [{"type": "image", "image": img} if c["type"] == "image" else c for c in m["content"]]}
                  for m in prompt]
        want = proc.apply_chat_template(inline, add_generation_prompt=True, tokenize=True, return_dict=True,
                                        add_vision_id=True)["input_ids"]
        want = [int(t) for t in (want[0] if len(want) == 1 else want)]
        assert trainer._prompt_row({"prompt": prompt, "images": [img]}, 0).input_ids.tolist() == want
        assert "Picture 1: " in proc.decode(want)


def test_grpo_refuses_rows_encoded_for_sft(tmp_path):
    """Rows encoded with labels (SFT) end with the answer: VisionGRPOTrainer refuses them by name
    instead of sampling the policy after the answer."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings

    proc = processor_for("qwen2_vl")
    sft, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(sft_rows(2)), proc)
    args = GRPOConfig(str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=2,
                      max_steps=1, report_to="none", save_strategy="no", gradient_checkpointing=False, **grpo_settings())
    trainer = VisionGRPOTrainer(model=testing.build_model("qwen2_vl"), reward_funcs=lambda completions, **kw: [0.0] * 2,
                                args=args, train_dataset=sft, processing_class=proc)
    with pytest.raises(ArgumentError, match="target tokens in 'labels'.*labels=False"):
        trainer.train()

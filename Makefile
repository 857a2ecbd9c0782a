# fsdpc — build, test and demo.
#
#   make            build the compiler (build/fsdpc)
#   make demo       set up, build, and run the demo
#   make check      the edit-build-test loop's tests (about a minute on two
#                   idle cores): the compiler suite against build/fsdpc and
#                   again against build/san/fsdpc (ASan + UBSan), the unit
#                   tests, and tiny's CPU trainer on 1 and 2 ranks resumed
#                   from a checkpoint (tests/all.sh --quick)
#   make test       set up, build, and run every test (what CI runs):
#                   make check's compiler tests, a fuzz smoke test, the
#                   kernels, the CPU runtime, checkpoints, Hugging Face model
#                   directories against transformers (tests/hf, in .venv:
#                   tools/venv.sh), the CUDA build, cudasim, the emitted
#                   trainers end to end (and with activation recomputation)
#                   and the PyTorch oracle; 27 minutes of suites on two idle
#                   cores, run side by side in three lanes, so about as long
#                   as the longest lane, cudasim's (tests/all.sh; --serial
#                   runs them one after another)
#   make SANITIZE=1 build only the sanitizer build, build/san/fsdpc
#   make runtime RT_SAN=1, make trainer FSD=... RT_SAN=1
#                   the CPU runtime and a trainer with ASan and UBSan
#                   (build/runtime-san, build/<model>/cpu-san);
#                   tests/faults/sanitize.sh runs them on 1-3 ranks
#   make fuzz       fuzz the compiler for FUZZ_SECONDS (libFuzzer, clang)
#   make golden     regenerate the golden files (read the diff before committing)
#   make bench      fsdpc's CPU trainer against PyTorch 1.13 and PyTorch 2
#                   (eager and torch.compile), compile times and the
#                   simulator's predictions, as one table (tens of minutes;
#                   not part of `make test`; the first run downloads PyTorch 2
#                   into .venv-torch2, ~2 GB; BENCH_QUICK=1, BENCH_LOADED=1,
#                   BENCH_MODELS=...; bench/bench.py, docs/performance.md)
#
# `setup` installs missing tools (flex, bison, ...) with apt-get when run as
# root, and otherwise prints the command to run.

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-missing-field-initializers
SANITIZE ?=
FUZZ_SECONDS ?= 60

ifeq ($(SANITIZE),1)
  B       := build/san
  CFLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
  LDFLAGS += -fsanitize=address,undefined
else
  B       := build
endif

SRCS    := util.c ast.c parse.c eval.c sema.c model.c ir.c lower.c autodiff.c recompute.c fuse.c \
           plan.c schedule.c memplan.c sim.c planner.c emit.c verify.c hfconfig.c
OBJS    := $(addprefix $(B)/obj/,$(SRCS:.c=.o)) $(B)/obj/parser.o $(B)/obj/lexer.o \
           $(B)/obj/templates.o $(B)/obj/calib.o $(B)/obj/jsonout.o $(B)/obj/json.o
GEN     := $(B)/gen
INC     := -Icompiler -I$(GEN)

.PHONY: all setup check test demo fuzz golden clean sim-check
all: $(B)/fsdpc $(B)/fsdata

$(B)/fsdpc: $(OBJS) $(B)/obj/main.o
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ -lm -ldl

# Pattern rules, so each build folder (build, build/san, build/fuzz) gets its
# own generated scanner and parser.
%/gen/parser.c %/gen/parser.h: grammar/parser.y
	@mkdir -p $(@D)
	bison -Wall -Werror --defines=$(@D)/parser.h -o $(@D)/parser.c $<

%/gen/lexer.c %/gen/lexer.h: grammar/lexer.l
	@mkdir -p $(@D)
	flex --header-file=$(@D)/lexer.h -o $(@D)/lexer.c $<

$(B)/obj/%.o: compiler/%.c compiler/fsdpc.h compiler/layers.def compiler/ops.def $(GEN)/parser.h $(GEN)/lexer.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(INC) -c -o $@ $<

# The runtime's libc-only JSON string escaper (--trace writes JSON too) and
# JSON reader (--from-hf reads a config.json).
$(B)/obj/jsonout.o: runtime/jsonout.c runtime/jsonout.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -c -o $@ $<
$(B)/obj/json.o: runtime/json.c runtime/json.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) -c -o $@ $<
$(B)/obj/sim.o: runtime/jsonout.h
$(B)/obj/hfconfig.o: runtime/json.h

# The kernel templates, carried inside fsdpc as strings.
%/gen/templates.c: $(wildcard templates/*.h) tools/embed_templates.sh
	@mkdir -p $(@D)
	tools/embed_templates.sh $(sort $(wildcard templates/*.h)) > $@
$(B)/obj/templates.o: $(GEN)/templates.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -c -o $@ $<

# The kernel calibrations --sim eff=measured uses (compiler/calib/*.calib),
# carried the same way.
%/gen/calib.c: $(wildcard compiler/calib/*.calib) tools/embed_templates.sh
	@mkdir -p $(@D)
	EMBED_FUNC=embedded_calib_text tools/embed_templates.sh $(sort $(wildcard compiler/calib/*.calib)) > $@
$(B)/obj/calib.o: $(GEN)/calib.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -c -o $@ $<

# Generated sources: warnings are the generators' business.
$(B)/obj/parser.o: $(GEN)/parser.c $(GEN)/lexer.h compiler/fsdpc.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -D_POSIX_C_SOURCE=200809L $(INC) -c -o $@ $<
$(B)/obj/lexer.o: $(GEN)/lexer.c $(GEN)/parser.h compiler/fsdpc.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -D_POSIX_C_SOURCE=200809L $(INC) -c -o $@ $<

# Unit tests that link the compiler's passes directly.
$(B)/test_schedule: tests/unit/test_schedule.c tests/unit/unit.c tests/unit/unit.h $(OBJS)
	$(CC) $(CFLAGS) $(WARN) $(INC) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lm -ldl
$(B)/test_pattern: tests/unit/test_pattern.c tests/unit/unit.c tests/unit/unit.h $(OBJS)
	$(CC) $(CFLAGS) $(WARN) $(INC) $(LDFLAGS) -o $@ $(filter-out %.h,$^) -lm -ldl
$(B)/simcheck_collective: tests/simcheck/collective.c $(OBJS)
	$(CC) $(CFLAGS) $(WARN) $(INC) $(LDFLAGS) -o $@ $^ -lm -ldl

setup:
	@tools/setup.sh

# The simulator's predictions beside published measurements, each within
# +-25% (tests/simcheck/run.sh; docs/simulator.md#the-calibration-table).
sim-check: all $(B)/simcheck_collective
	@tests/simcheck/run.sh

check: setup
	@$(MAKE) --no-print-directory all build/test_schedule build/test_pattern SANITIZE=
	@$(MAKE) --no-print-directory all SANITIZE=1
	@MAKE="$(MAKE)" tests/all.sh --quick

test: setup
	@$(MAKE) --no-print-directory all build/test_schedule build/test_pattern build/simcheck_collective SANITIZE=
	@$(MAKE) --no-print-directory all SANITIZE=1
	@MAKE="$(MAKE)" tests/all.sh

demo: setup
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory runtime build/fsdata
	@FSDPC=$(B)/fsdpc MAKE="$(MAKE)" tools/demo.sh

golden: all
	@FSDPC=$(B)/fsdpc tests/run.sh --regen

# libFuzzer target: the front end on arbitrary bytes, with ASan and UBSan.
# Needs clang and its runtime libraries (Debian: clang libclang-rt-dev).
# New inputs go to build/fuzz/corpus; a crash, leak, UB report or timeout
# stops the run and is written to build/fuzz/ (crash-*, leak-*, timeout-*).
# Each one is a bug: fix it, then add the input to tests/fuzz/seeds/.
FUZZ_B      := build/fuzz
FUZZ_CC     ?= clang
FUZZ_CFLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
               -fno-sanitize-recover=all
# -timeout: seconds per input; -rss_limit_mb: memory, so a blow-up is a report.
FUZZ_OPTS   := -timeout=5 -rss_limit_mb=2048 -max_len=8192 -dict=tests/fuzz/fsd.dict \
               -artifact_prefix=$(FUZZ_B)/

# The front end's objects again, instrumented (only what the harness calls,
# so the build stays quick), plus the harness; generated sources come from
# $(GEN), like the ordinary build's.
FUZZ_SRCS   := $(SRCS) parser.c lexer.c templates.c calib.c jsonout.c json.c
FUZZ_OBJS   := $(addprefix $(FUZZ_B)/obj/,$(FUZZ_SRCS:.c=.o)) $(FUZZ_B)/obj/fuzz_frontend.o
FUZZ_CC_O    = $(FUZZ_CC) $(FUZZ_CFLAGS) -std=c11 -D_POSIX_C_SOURCE=200809L $(INC) -c -o $@ $<

$(FUZZ_B)/fuzz_frontend: $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lm -ldl
$(FUZZ_B)/obj/%.o: compiler/%.c $(wildcard compiler/*.h compiler/*.def) $(GEN)/parser.h $(GEN)/lexer.h
	@mkdir -p $(@D)
	$(FUZZ_CC_O)
$(FUZZ_B)/obj/%.o: $(GEN)/%.c $(GEN)/parser.h $(GEN)/lexer.h compiler/fsdpc.h
	@mkdir -p $(@D)
	$(FUZZ_CC_O)
$(FUZZ_B)/obj/jsonout.o: runtime/jsonout.c runtime/jsonout.h
	@mkdir -p $(@D)
	$(FUZZ_CC_O)
$(FUZZ_B)/obj/json.o: runtime/json.c runtime/json.h
	@mkdir -p $(@D)
	$(FUZZ_CC_O)
$(FUZZ_B)/obj/fuzz_frontend.o: tests/fuzz/fuzz_frontend.c compiler/fsdpc.h
	@mkdir -p $(@D)
	$(FUZZ_CC_O)

fuzz: setup $(FUZZ_B)/fuzz_frontend
	@mkdir -p $(FUZZ_B)/corpus
	cp examples/*.fsd $(FUZZ_B)/corpus/
	$(FUZZ_B)/fuzz_frontend $(FUZZ_OPTS) -max_total_time=$(FUZZ_SECONDS) \
	  $(FUZZ_B)/corpus tests/fuzz/seeds

# ── the CPU runtime, and the data tool ──
# `make runtime` builds what an emitted train.cu links against on the CPU:
# build/runtime/libfsdrt_cpu.a, and libfsdrt_cpu64.a built with
# -DFSD_FLOAT64 (`real` is double, for finite-difference gradient checks).
# It needs MPI and a BLAS (tools/setup.sh installs them). A trainer links
#   mpicc -x c -O2 -fopenmp -Iruntime train.cu -Lbuild/runtime -lfsdrt_cpu $(RT_LIBS)
# (`make -s rt-libs` prints RT_LIBS).
# runtime/arena.c needs only libc (compiler/memplan.c places by the same rule);
# runtime/jsonout.c (JSON string escaping) and runtime/json.c (the JSON
# reader) need only libc, and the compiler links them (above).
MPICC    ?= mpicc
# RT_SAN=1: the same libraries built with AddressSanitizer and UBSan, at -O1
# with frame pointers, into build/runtime-san (CPU backend only); `make
# trainer ... RT_SAN=1` builds a trainer against them, itself instrumented,
# into build/<model>/cpu-san. Any report stops the process (no recovery);
# tests/faults/sanitize.sh runs tiny and tiny_llama under them.
RT_SAN   ?=
ifeq ($(RT_SAN),1)
  RT       := build/runtime-san
  RT_SANFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
  ifneq ($(filter runtime-cuda runtime-cudasim trainer-cudasim,$(MAKECMDGOALS)),)
    $(error RT_SAN=1 builds the CPU runtime only; cudasim has CUDASIM_SAN=1)
  endif
else
  RT       := build/runtime
  RT_SANFLAGS :=
endif
RT_SRCS  := base.c blas.c common.c ranks.c cpu.c data.c weights.c safetensors.c arena.c json.c jsonout.c hfnames.c hfconfig.c \
            ckpt.c optim.c stop.c lr.c eval.c memory.c
RT_HDRS  := runtime/fsdrt.h runtime/internal.h runtime/half.h runtime/json.h runtime/jsonout.h
# -fno-math-errno: nothing reads errno after a math call, and without it a
# sqrtf stops the compiler vectorising a loop (the optimizer's, a kernel's).
RT_CFLAGS_BASE = -O2 -g -fopenmp -fno-math-errno $(WARN)
# BLAS: the library behind the CPU runtime's products (runtime/blas.c,
# docs/performance.md#choosing-the-blas): openblas, dnnl (oneDNN; the float64
# runtime keeps OpenBLAS, which oneDNN links beside it: oneDNN has no double
# product) or mkl (MKLROOT: a folder with include/mkl.h and lib/libmkl_rt.so*).
# Unset, tools/blas.sh picks this CPU's fastest from tools/blas.table among
# those installed; it is worked out once, when first used, so after `setup`
# has installed what the table wants.
ifneq ($(origin BLAS),environment)
BLAS = $(eval BLAS := $(shell tools/blas.sh default))$(BLAS)
endif
OPENBLAS_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS   = $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
BLAS_CFLAGS_openblas = $(OPENBLAS_CFLAGS)
BLAS_LIBS_openblas   = $(OPENBLAS_LIBS)
BLAS_CFLAGS_dnnl = -DFSD_BLAS_DNNL $(OPENBLAS_CFLAGS)
BLAS_LIBS_dnnl   = -ldnnl -Wl,--push-state,--as-needed $(OPENBLAS_LIBS) -Wl,--pop-state
BLAS_CFLAGS_mkl  = -DFSD_BLAS_MKL -I$(MKLROOT)/include
BLAS_LIBS_mkl    = $(firstword $(wildcard $(MKLROOT)/lib/libmkl_rt.so*)) -Wl,-rpath,$(MKLROOT)/lib
RT_CFLAGS = $(RT_CFLAGS_BASE) $(BLAS_CFLAGS_$(BLAS))
RT_LIBS   = -fopenmp -pthread $(BLAS_LIBS_$(BLAS)) -lm

.PHONY: runtime runtime-tests rt-libs blas-flags blas-bench FORCE
runtime: $(RT)/libfsdrt_cpu.a $(RT)/libfsdrt_cpu64.a

# blas.o is rebuilt when BLAS (or MKLROOT) changes: the stamp is rewritten
# only then.
$(RT)/blas.stamp: FORCE
	@case "$(BLAS)" in openblas|dnnl) ;; \
	  mkl) [ -e "$(MKLROOT)/include/mkl.h" ] || { echo "make: BLAS=mkl needs MKLROOT, a folder with include/mkl.h and lib/libmkl_rt.so* (now: '$(MKLROOT)')"; exit 1; } ;; \
	  *) echo "make: BLAS=$(BLAS) is not one of openblas, dnnl, mkl"; exit 1 ;; esac
	@mkdir -p $(@D)
	@echo "$(BLAS) $(MKLROOT)" | cmp -s - $@ || echo "$(BLAS) $(MKLROOT)" >$@
$(RT)/obj/blas.o $(RT)/obj64/blas.o: $(RT)/blas.stamp
rt-libs:
	@echo "$(RT_LIBS)"
# BLAS's own compile and link flags, "CFLAGS|LIBS" (tools/blas.sh builds its
# benchmark with them)
blas-flags:
	@echo "$(BLAS_CFLAGS_$(BLAS))|$(BLAS_LIBS_$(BLAS))"
# every library here checked, and timed on one thread (tools/blasbench.c)
blas-bench: setup
	@tools/blas.sh measure

$(RT)/libfsdrt_cpu.a: $(addprefix $(RT)/obj/,$(RT_SRCS:.c=.o))
	ar rcs $@ $^
$(RT)/libfsdrt_cpu64.a: $(addprefix $(RT)/obj64/,$(RT_SRCS:.c=.o))
	ar rcs $@ $^
$(RT)/obj/%.o: runtime/%.c $(RT_HDRS)
	@mkdir -p $(@D)
	$(MPICC) $(RT_CFLAGS) $(RT_SANFLAGS) -c -o $@ $<
$(RT)/obj64/%.o: runtime/%.c $(RT_HDRS)
	@mkdir -p $(@D)
	$(MPICC) $(RT_CFLAGS) $(RT_SANFLAGS) -DFSD_FLOAT64 -c -o $@ $<

# ── the CUDA runtime ──
#   make runtime-cuda [ARCH=sm_80,sm_90]   → build/runtime/libfsdrt_cuda.a
#   make runtime-cuda MPI=0                → build/runtime/libfsdrt_cuda_nompi.a
# the CUDA backend (CUDA_SRCS, cuda_kernels.cu: NCCL, cuBLASLt, streams) with the
# backend-independent sources of the CPU runtime (all of RT_SRCS but cpu.c),
# for an emitted train.cu built with nvcc (docs/cuda.md). Needs the CUDA
# toolkit, NCCL and MPI; ARCH lists the GPU architectures, as for the trainer.
# MPI=0 builds it without MPI (the C sources with CC, -DFSD_MPI=0, nothing of
# MPI linked): its trainers start alone or through FSD_NCCL_ID_FILE, for
# srun/torchrun-style launches and machines that have no MPI.
comma    := ,
NVCC     ?= nvcc
ARCH     ?= sm_80,sm_90
# an ARCH from the environment that is no GPU architecture (x86_64, say) is not ours
ifeq ($(filter sm_%,$(firstword $(subst $(comma), ,$(ARCH)))),)
  ARCH := sm_80,sm_90
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(shell command -v $(NVCC) 2>/dev/null)))
NCCL_HOME ?=
CUDA_GENCODE = $(foreach a,$(subst $(comma), ,$(ARCH)),-gencode arch=compute_$(a:sm_%=%),code=$(a))
MPI      ?= 1
# an MPI from the environment that is neither 0 nor 1 (a module system's
# name for one, say) is not ours; on the command line it is a mistake
ifeq ($(filter 0 1,$(MPI)),)
  ifneq ($(filter environment%,$(origin MPI)),)
    MPI := 1
  else
    $(error MPI=$(MPI): use MPI=1 (the default: the CUDA build bootstraps over MPI) or MPI=0 (without MPI, docs/cuda.md))
  endif
endif
ifeq ($(MPI),0)
  CU_RT    := $(RT)/cuda-nompi
  CU_LIB   := fsdrt_cuda_nompi
  CU_CC    := $(CC)
  CU_DEFS  := -DFSD_MPI=0
else
  CU_RT    := $(RT)/cuda
  CU_LIB   := fsdrt_cuda
  CU_CC    := $(MPICC)
  CU_DEFS  :=
endif
# the backend's host side, one concern a file (runtime/cuda_internal.h)
CUDA_SRCS := cuda_err.c cuda_boot.c cuda_mem.c cuda_comm.c cuda_gemm.c cuda_step.c
CU_SRCS  := $(filter-out cpu.c blas.c,$(RT_SRCS)) $(CUDA_SRCS)
CU_INC   := -I$(CUDA_HOME)/include $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
# MPI's link flags in nvcc's spelling (-Wl,x → -Xlinker x)
MPI_LINK  = $(patsubst -Wl$(comma)%,-Xlinker %,$(patsubst -pthread,-Xcompiler -pthread,$(shell $(MPICC) -showme:link 2>/dev/null || $(MPICC) -link_info 2>/dev/null | cut -d' ' -f2-)))
CU_SYSLIBS := -Xcompiler -fopenmp -lpthread -lm
CUDA_LIBS = $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib) -lnccl -lcublasLt -lcudart \
            $(if $(filter 1,$(MPI)),$(MPI_LINK)) $(CU_SYSLIBS)
NVCC_BASE  := -O2 -std=c++17 -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
NVCC_FLAGS = $(NVCC_BASE) $(CUDA_GENCODE)

.PHONY: runtime-cuda cuda-build-vars
runtime-cuda: $(RT)/lib$(CU_LIB).a

$(RT)/lib$(CU_LIB).a: $(addprefix $(CU_RT)/obj/,$(CU_SRCS:.c=.o)) $(CU_RT)/obj/cuda_kernels.o
	ar rcs $@ $^
$(CU_RT)/obj/%.o: runtime/%.c $(RT_HDRS) runtime/cuda.h runtime/cuda_internal.h
	@mkdir -p $(@D)
	$(CU_CC) $(RT_CFLAGS) $(CU_DEFS) $(CU_INC) -c -o $@ $<
# the kernels are rebuilt when ARCH changes (the stamp holds the list)
$(CU_RT)/obj/cuda_kernels.o: runtime/cuda_kernels.cu runtime/cuda.h $(CU_RT)/arch.$(subst $(comma),_,$(ARCH))
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -c -o $@ $<
$(CU_RT)/arch.%:
	@mkdir -p $(@D)
	@rm -f $(CU_RT)/arch.*
	@touch $@

# The MPI=0 build's sources and flags as shell assignments: tests/gpu/run.sh
# --pack writes them into a pack, whose run.sh builds the runtime with them
# on a GPU machine that has no make (the architecture is that machine's).
cuda-build-vars:
	@printf "%s='%s'\n" CU_SRCS "$(CU_SRCS)" CU_CFLAGS "$(RT_CFLAGS_BASE) -DFSD_MPI=0" \
	  NVCC_BASE "$(NVCC_BASE)" CU_SYSLIBS "$(CU_SYSLIBS)"

# ── trainers ──
#   make trainer FSD=path/model.fsd BACKEND=cpu     → build/<model>/cpu/train
# compiles the model with fsdpc (train.cu lands beside the binary) and builds
# it against the CPU runtime; BACKEND=cpu64 builds the float64 variant used by
# gradient checks (-DFSD_FLOAT64), into build/<model>/cpu64/; BACKEND=cuda
# builds it with nvcc against the CUDA runtime for ARCH (default sm_80,sm_90),
# into build/<model>/cuda/ (docs/cuda.md); with MPI=0, against the runtime
# without MPI, and without `setup` (which would install MPI). RT_SAN=1
# builds a cpu or cpu64 trainer with ASan and UBSan against build/runtime-san
# (above), into build/<model>/cpu-san (cpu64-san).
FSD      ?= examples/tiny.fsd
BACKEND  ?= cpu
MODEL    := $(basename $(notdir $(FSD)))
TRAINER  := build/$(MODEL)/$(BACKEND)$(if $(RT_SANFLAGS),-san)
TRAINER_FLAGS_cpu   :=
TRAINER_FLAGS_cpu64 := -DFSD_FLOAT64
TRAINER_LIB_cpu     := $(RT)/libfsdrt_cpu.a
TRAINER_LIB_cpu64   := $(RT)/libfsdrt_cpu64.a
# fsdpc's planning flags for the trainer, e.g. FSDPC_FLAGS="--world 16": the
# world replicate = auto and memory_budget plan for (docs/design.md#replicate-auto)
FSDPC_FLAGS ?=

.PHONY: trainer
trainer: $(if $(filter cuda,$(BACKEND)),$(if $(filter 0,$(MPI)),,setup),setup)
	@case "$(BACKEND)" in cpu|cpu64|cuda) ;; *) echo "make trainer: BACKEND=$(BACKEND) is not one of cpu, cpu64, cuda"; exit 1;; esac
	@case "$(BACKEND)$(RT_SAN)" in cuda1) echo "make trainer: RT_SAN=1 builds the CPU runtime only (BACKEND=cpu or cpu64)"; exit 1;; esac
	@$(MAKE) --no-print-directory $(B)/fsdpc $(if $(filter cuda,$(BACKEND)),runtime-cuda,runtime)
	@mkdir -p $(TRAINER)
	$(B)/fsdpc $(FSD) $(FSDPC_FLAGS) -o $(TRAINER)/train.cu
ifeq ($(BACKEND),cuda)
	$(NVCC) -x cu $(NVCC_FLAGS) -Iruntime $(TRAINER)/train.cu -L$(RT) -l$(CU_LIB) $(CUDA_LIBS) \
	  -o $(TRAINER)/train
else
	$(MPICC) -x c -std=c11 $(RT_CFLAGS) $(RT_SANFLAGS) $(TRAINER_FLAGS_$(BACKEND)) -Iruntime \
	  $(TRAINER)/train.cu -x none $(TRAINER_LIB_$(BACKEND)) $(RT_LIBS) $(RT_SANFLAGS) -o $(TRAINER)/train
endif
	@echo "built $(TRAINER)/train (source: $(TRAINER)/train.cu)"

# ── benchmarks ──
# `make bench`: bench/bench.py with its own trainers in build/bench/, so a
# test building build/<model>/cpu meanwhile does not swap them. Needs
# Debian's python3-torch (/usr/bin/python3); PyTorch 2 comes from PyPI into
# .venv-torch2 (tools/venv-torch2.sh, reused once made): without PyPI the
# bench says so and runs without it.
BENCH_FSD := examples/tiny.fsd bench/gpt4x256.fsd bench/gpt6x384.fsd bench/gpt2_124m.fsd
.PHONY: bench
bench: setup
	@$(MAKE) --no-print-directory $(B)/fsdpc $(B)/fsdata runtime
	@for f in $(BENCH_FSD); do \
	  $(MAKE) --no-print-directory -s trainer FSD=$$f TRAINER=build/bench/$$(basename $$f .fsd) \
	    || exit 1; done
	@tools/venv-torch2.sh || echo "bench: no PyTorch 2 (tools/venv-torch2.sh failed above)"
	@/usr/bin/python3 bench/bench.py

# ── install ──
#   make install PREFIX=/usr/local
# puts fsdpc and fsdata in PREFIX/bin, fsdrt.h in PREFIX/include/fsdpc, the
# runtime libraries in PREFIX/lib and pkg-config files for them, so an
# emitted train.cu builds anywhere:
#   mpicc -x c train.cu $(pkg-config --cflags --libs fsdrt-cpu) -o train
PREFIX  ?= /usr/local
.PHONY: install
install: setup
	@$(MAKE) --no-print-directory $(B)/fsdpc $(B)/fsdata runtime
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include/fsdpc \
	  $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(B)/fsdpc $(B)/fsdata $(DESTDIR)$(PREFIX)/bin/
	install -m 644 runtime/fsdrt.h $(DESTDIR)$(PREFIX)/include/fsdpc/
	install -m 644 $(RT)/libfsdrt_cpu.a $(RT)/libfsdrt_cpu64.a $(DESTDIR)$(PREFIX)/lib/
	for v in cpu cpu64; do \
	  flags=""; [ $$v = cpu64 ] && flags=" -DFSD_FLOAT64"; \
	  printf '%s\n' "prefix=$(PREFIX)" 'includedir=$${prefix}/include/fsdpc' \
	    'libdir=$${prefix}/lib' '' "Name: fsdrt-$$v" \
	    "Description: fsdpc runtime, $$v backend (build emitted train.cu with mpicc -x c)" \
	    'Version: $(shell sed -n 's/^#define FSDPC_VERSION "\(.*\)"/\1/p' compiler/fsdpc.h)' \
	    "Cflags: -I\$${includedir} -fopenmp$$flags $(BLAS_CFLAGS_$(BLAS))" \
	    "Libs: -L\$${libdir} -lfsdrt_$$v -fopenmp $(RT_LIBS)" \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/fsdrt-$$v.pc; \
	done

# fsdata: makes and inspects token files (plain C, no MPI).
$(B)/fsdata: tools/fsdata.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) $(LDFLAGS) -o $@ $<

# What tests/runtime/run.sh runs (it builds them itself).
runtime-tests: runtime build/fsdata $(RT)/trainer $(RT)/trainer64 $(RT)/test_arena $(RT)/test_half \
               $(RT)/test_gemm
$(RT)/trainer: tests/runtime/trainer.c $(RT)/libfsdrt_cpu.a
	$(MPICC) $(RT_CFLAGS) -Iruntime -o $@ $^ $(RT_LIBS)
$(RT)/trainer64: tests/runtime/trainer.c $(RT)/libfsdrt_cpu64.a
	$(MPICC) $(RT_CFLAGS) -DFSD_FLOAT64 -Iruntime -o $@ $^ $(RT_LIBS)
$(RT)/test_arena: tests/runtime/test_arena.c runtime/arena.c runtime/fsdrt.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) -Iruntime -o $@ tests/runtime/test_arena.c runtime/arena.c
$(RT)/test_gemm: tests/runtime/test_gemm.c $(RT)/libfsdrt_cpu.a
	$(MPICC) $(RT_CFLAGS) -Iruntime -o $@ $^ $(RT_LIBS)
# What tests/data/run.sh builds besides a trainer: --shuffle's order alone.
build/data/test_shuffle: tests/data/test_shuffle.c $(RT)/libfsdrt_cpu.a
	@mkdir -p $(@D)
	$(MPICC) $(RT_CFLAGS) -Iruntime -o $@ $^ $(RT_LIBS)
$(RT)/test_half: tests/runtime/test_half.c runtime/half.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(WARN) -Iruntime -o $@ $< -lm

# ── cudasim: the CUDA runtime on a simulated device (tests/cudasim) ──
#   make runtime-cudasim                   → build/cudasim/libfsdrt_cudasim.a
#   make trainer-cudasim FSD=path/model.fsd → build/<model>/cudasim/train
#   make trainer-cudasim FSD=... MPI=0      → build/<model>/cudasim_nompi/train
#   ... CUDASIM_SAN=1                       → the same with AddressSanitizer
# runtime/cuda_*.c and the rest of the CUDA runtime's host side, built with
# the C compiler against tests/cudasim's CUDA, NCCL and cuBLASLt on host
# memory; runtime/cuda_kernels.cu built as host C++; a trainer is the CPU
# build's train.cu linked against it (tests/cudasim/README.md). Test-only.
MPICXX   ?= mpicxx
# CUDASIM_SAN=1: the same, built with AddressSanitizer, in build/cudasim-san
# and build/<model>/cudasim-san (device memory is heap memory here, so a
# copy or kernel past a buffer's end is reported)
CUDASIM_SAN ?=
SIM_SAN  := $(if $(filter 1,$(CUDASIM_SAN)),-fsanitize=address -fno-omit-frame-pointer)
SIM      := build/cudasim$(if $(SIM_SAN),-san)
SIM_CC   := $(filter-out cpu.c,$(RT_SRCS))
SIM_CXX  := device.cc nccl.cc cublaslt.cc
SIM_HDRS := $(wildcard tests/cudasim/*.h tests/cudasim/include/*.h)
SIM_CXXFLAGS = -std=c++17 -O2 -g -fopenmp -Wall -Wextra -Wno-unused-parameter $(SIM_SAN) \
               -Itests/cudasim/include -Itests/cudasim -Iruntime

SIM_OBJS  = $(addprefix $(SIM)/obj/,$(SIM_CC:.c=.o) $(SIM_CXX:.cc=.o) cuda_kernels.o)
SIM_LIB  := $(SIM)/libfsdrt_cudasim$(if $(filter 0,$(MPI)),_nompi).a

.PHONY: runtime-cudasim trainer-cudasim cudasim-vars
runtime-cudasim: $(SIM_LIB)
$(SIM)/libfsdrt_cudasim.a: $(SIM_OBJS) $(addprefix $(SIM)/obj/,$(CUDA_SRCS:.c=.o))
	ar rcs $@ $^
# MPI=0: the backend without MPI (its FSD_NCCL_ID_FILE bootstrap), every
# cuda_*.c built with -DFSD_MPI=0 as `make runtime-cuda MPI=0` builds them;
# the simulated NCCL still runs over MPI, under mpirun
$(SIM)/libfsdrt_cudasim_nompi.a: $(SIM_OBJS) $(addprefix $(SIM)/obj/nompi/,$(CUDA_SRCS:.c=.o))
	ar rcs $@ $^
$(SIM)/obj/nompi/%.o: runtime/%.c $(RT_HDRS) runtime/cuda.h runtime/cuda_internal.h $(SIM_HDRS)
	@mkdir -p $(@D)
	$(CC) $(RT_CFLAGS) $(SIM_SAN) -DFSD_MPI=0 -Itests/cudasim/include -c -o $@ $<
$(SIM)/obj/%.o: runtime/%.c $(RT_HDRS) runtime/cuda.h runtime/cuda_internal.h $(SIM_HDRS)
	@mkdir -p $(@D)
	$(MPICC) $(RT_CFLAGS) $(SIM_SAN) -Itests/cudasim/include -c -o $@ $<
$(SIM)/obj/%.o: tests/cudasim/%.cc $(SIM_HDRS)
	@mkdir -p $(@D)
	$(MPICXX) $(SIM_CXXFLAGS) -c -o $@ $<
$(SIM)/obj/cuda_kernels.o: runtime/cuda_kernels.cu runtime/cuda.h $(SIM_HDRS)
	@mkdir -p $(@D)
	$(MPICXX) $(SIM_CXXFLAGS) -x c++ -include kernel.h -c -o $@ $<
# the flags a cudasim trainer is built with, as shell assignments (for
# tests/cudasim/run.sh's mutants of runtime/cuda_*.c)
cudasim-vars:
	@printf "%s='%s'\n" SIM_CFLAGS "$(RT_CFLAGS)" SIM_LIBS "$(RT_LIBS) -lstdc++"

# the fakes' own tests (tests/cudasim/test_*.cc)
$(SIM)/test_%: tests/cudasim/test_%.cc $(addprefix $(SIM)/obj/,$(SIM_CXX:.cc=.o))
	$(MPICXX) $(SIM_CXXFLAGS) -o $@ $^
SIM_TRAINER := build/$(MODEL)/cudasim$(if $(SIM_SAN),-san)$(if $(filter 0,$(MPI)),_nompi)
trainer-cudasim: $(B)/fsdpc $(SIM_LIB)
	@mkdir -p $(SIM_TRAINER)
	$(B)/fsdpc $(FSD) -o $(SIM_TRAINER)/train.cu
	$(MPICC) -x c $(RT_CFLAGS) $(SIM_SAN) -Iruntime $(SIM_TRAINER)/train.cu -x none \
	  $(SIM_LIB) $(RT_LIBS) $(SIM_SAN) -lstdc++ -o $(SIM_TRAINER)/train

clean:
	rm -rf build

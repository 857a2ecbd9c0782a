# fsdpc — build, test and demo.
#
#   make            build the compiler (build/fsdpc)
#   make demo       set up, build, and run the demo
#   make test       set up, build, and run every test (what CI runs)
#   make test SANITIZE=1   the same under AddressSanitizer and UBSan
#   make fuzz       fuzz the front end for FUZZ_SECONDS (libFuzzer)
#   make golden     regenerate the golden files (read the diff before committing)
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

SRCS    := util.c ast.c parse.c sema.c model.c
OBJS    := $(addprefix $(B)/obj/,$(SRCS:.c=.o)) $(B)/obj/parser.o $(B)/obj/lexer.o
GEN     := $(B)/gen
INC     := -Icompiler -I$(GEN)

.PHONY: all setup test demo fuzz golden clean
all: $(B)/fsdpc

$(B)/fsdpc: $(OBJS) $(B)/obj/main.o
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ -lm

$(GEN)/parser.c $(GEN)/parser.h: grammar/parser.y
	@mkdir -p $(GEN)
	bison -Wall -Werror --defines=$(GEN)/parser.h -o $(GEN)/parser.c $<

$(GEN)/lexer.c $(GEN)/lexer.h: grammar/lexer.l
	@mkdir -p $(GEN)
	flex --header-file=$(GEN)/lexer.h -o $(GEN)/lexer.c $<

$(B)/obj/%.o: compiler/%.c compiler/fsdpc.h compiler/layers.def $(GEN)/parser.h $(GEN)/lexer.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(WARN) $(INC) -c -o $@ $<

# Generated sources: warnings are the generators' business.
$(B)/obj/parser.o: $(GEN)/parser.c $(GEN)/lexer.h compiler/fsdpc.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -D_POSIX_C_SOURCE=200809L $(INC) -c -o $@ $<
$(B)/obj/lexer.o: $(GEN)/lexer.c $(GEN)/parser.h compiler/fsdpc.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -D_POSIX_C_SOURCE=200809L $(INC) -c -o $@ $<

setup:
	@tools/setup.sh

test: setup
	@$(MAKE) --no-print-directory all
	@FSDPC=$(B)/fsdpc SANITIZE=$(SANITIZE) tests/run.sh

demo: setup
	@$(MAKE) --no-print-directory all
	@FSDPC=$(B)/fsdpc tools/demo.sh

golden: all
	@FSDPC=$(B)/fsdpc tests/run.sh --regen

# libFuzzer target: the front end on arbitrary bytes, with ASan and UBSan.
FUZZ_B := build/fuzz
fuzz: setup
	@mkdir -p $(FUZZ_B)/gen $(FUZZ_B)/corpus
	bison --defines=$(FUZZ_B)/gen/parser.h -o $(FUZZ_B)/gen/parser.c grammar/parser.y
	flex --header-file=$(FUZZ_B)/gen/lexer.h -o $(FUZZ_B)/gen/lexer.c grammar/lexer.l
	clang -g -O1 -std=c11 -D_POSIX_C_SOURCE=200809L -fsanitize=fuzzer,address,undefined \
	  -Icompiler -I$(FUZZ_B)/gen -o $(FUZZ_B)/fuzz_frontend tests/fuzz/fuzz_frontend.c \
	  $(addprefix compiler/,$(SRCS)) $(FUZZ_B)/gen/parser.c $(FUZZ_B)/gen/lexer.c -lm
	cp examples/*.fsd $(FUZZ_B)/corpus/
	$(FUZZ_B)/fuzz_frontend -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=5 \
	  -dict=tests/fuzz/fsd.dict $(FUZZ_B)/corpus tests/fuzz/seeds

clean:
	rm -rf build

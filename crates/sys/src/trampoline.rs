//! The one way corehop's preload code runs a helper before a libc entry point and then enters
//! the function the helper chose as if the program had called it: the preload library's
//! `vfork`/`clone` trampolines (`crates/preload/src/children.rs`) and every entry point of its
//! start-up stub (`crates/preload-stub`, which includes this file by path). x86-64 only.

/// Expands to a `naked_asm!` body: `$prefix` lines; then the six argument registers and al (a
/// variadic call's count of vector registers) saved; `$setup` lines (which may move argument
/// registers into the helper's); `call {helper}`; the registers restored; and a jump to the
/// address the helper returned. `$operands` name `helper` and whatever the lines use.
///
/// Why it is sound: seven pushes after the return address leave rsp 16-byte aligned for the
/// call, and a seventh argument, on the stack above the return address, is not touched. The
/// helper's result goes through r11, which carries no argument. The jump so enters the target
/// with every register and the stack as the program left them: what a `vfork` needs (its child
/// returns through the program's frame, and the stack below rsp is free memory by then) and
/// what a variadic function needs.
#[macro_export]
macro_rules! call_then_jump {
    ([$($prefix:literal),*] [$($setup:literal),*] $($operands:tt)*) => {
        core::arch::naked_asm!(
            $($prefix,)*
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "push rax",
            $($setup,)*
            "call {helper}",
            "mov r11, rax",
            "pop rax",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "jmp r11",
            $($operands)*
        )
    };
}

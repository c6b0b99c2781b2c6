! The Fortran module vlcc on regions of every type it is generic over
! (real64, real32, int32, int64) and every rank (0 to 3).  The value of an
! element is k * 100 + its position in memory (Fortran's order), k the step or
! the version it belongs to, so that Python reads each region as the array
! of the reversed shape whose C-order elements are k * 100 + 0, 1, 2, ...
!
!   regions run CONFIG_JSON STEPS   run the schedule; check every answer as
!                                   tests/capi/programs/answers.c does; print
!                                   "ok: T turn, R adjoint steps"
!   regions errors                  bad calls from Fortran: print "name|code|message"
!   regions commit PATH K           commit versions 0 .. K-1 of four regions,
!                                   print "version k id"
!   regions checkout PATH REF       fill the four regions from REF, print
!                                   "k" of each region (-1 if not uniform)
module regions_state
   use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64
   implicit none
   ! the run's regions: ranks 1, 2, 3, 0
   real(real64), target :: u(5)
   real(real32), target :: a(3, 2)
   integer(int32), target :: c(2, 2, 2)
   integer(int64), target :: k0
   ! the history's regions: ranks 3, 0, 1, 2
   real(real64), target :: x(4, 3, 2)
   real(real32), target :: s
   integer(int32), target :: ids(3)
   integer(int64), target :: m(2, 3)

contains

   ! values(n) = k * 100 + 0 .. n - 1
   pure function values(k, n) result(v)
      integer(int64), intent(in) :: k
      integer, intent(in) :: n
      integer(int64) :: v(n)
      integer :: i
      v = [(k*100 + i, i=0, n - 1)]
   end function values

   subroutine set_run(k)
      integer(int64), intent(in) :: k
      u = real(values(k, 5), real64)
      a = reshape(real(values(k, 6), real32), [3, 2])
      c = reshape(int(values(k, 8), int32), [2, 2, 2])
      k0 = k*100
   end subroutine set_run

   logical function run_holds(k)
      integer(int64), intent(in) :: k
      run_holds = all(u == real(values(k, 5), real64)) &
                  .and. all(reshape(a, [6]) == real(values(k, 6), real32)) &
                  .and. all(reshape(c, [8]) == int(values(k, 8), int32)) &
                  .and. k0 == k*100
   end function run_holds

   subroutine scribble()
      u = -1; a = -1; c = -1; k0 = -1
   end subroutine scribble

   subroutine set_history(k)
      integer(int64), intent(in) :: k
      x = reshape(real(values(k, 24), real64), [4, 3, 2])
      s = real(k*100, real32)
      ids = int(values(k, 3), int32)
      m = reshape(values(k, 6), [2, 3])
   end subroutine set_history

   ! The k of a region's values, or -1 if they are not k * 100 + position.
   integer(int64) function which(v) result(k)
      integer(int64), intent(in) :: v(:)
      k = v(1)/100
      if (any(v /= values(k, size(v)))) k = -1
   end function which

   subroutine check(ierr, what)
      use vlcc, only: vlcc_last_error
      integer, intent(in) :: ierr
      character(len=*), intent(in) :: what
      if (ierr /= 0) then
         print '(a, " failed (", i0, "): ", a)', what, ierr, vlcc_last_error()
         stop 1
      end if
   end subroutine check
end module regions_state

program regions
   use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr
   use vlcc
   use regions_state
   implicit none
   character(len=4096) :: what, arg2, arg3

   call get_command_argument(1, what)
   call get_command_argument(2, arg2)
   call get_command_argument(3, arg3)
   select case (trim(what))
   case ('run')
      call run_schedule(trim(arg2), arg3)
   case ('errors')
      call bad_calls()
   case ('commit')
      call commit(trim(arg2), arg3)
   case ('checkout')
      call checkout(trim(arg2), trim(arg3))
   case default
      print '(a)', 'usage: regions run|errors|commit|checkout ...'
      stop 2
   end select

contains

   subroutine violation(text, act)
      character(len=*), intent(in) :: text
      type(vlcc_action), intent(in) :: act
      print '("violation: ", a, " at answer (", i0, ", ", i0, ", ", i0, ")")', text, act%kind, &
         act%from, act%to
      stop 1
   end subroutine violation

   subroutine run_schedule(config, steps)
      character(len=*), intent(in) :: config, steps
      type(c_ptr) :: run
      type(vlcc_action) :: act
      integer(int64) :: n, expect, turns, reverses
      read (steps, *) n
      call set_run(0_int64)
      call check(vlcc_run_open(run, config), 'vlcc_run_open')
      call check(vlcc_run_protect(run, 'u', u), 'protect u')
      call check(vlcc_run_protect(run, 'a', a), 'protect a')
      call check(vlcc_run_protect(run, 'c', c), 'protect c')
      call check(vlcc_run_protect(run, 'k', k0), 'protect k')
      expect = n - 1
      turns = 0
      reverses = 0
      do
         call check(vlcc_run_next(run, act), 'vlcc_run_next')
         select case (act%kind)
         case (VLCC_ADVANCE)
            if (.not. run_holds(act%from)) call violation('the regions do not hold u_from', act)
            if (act%from >= act%to .or. act%to > n) call violation('a bad step range', act)
            call set_run(act%to)
         case (VLCC_TURN)
            if (turns > 0 .or. reverses > 0) call violation('TURN after TURN or REVERSE', act)
            if (act%from /= n .or. act%to /= n .or. .not. run_holds(n)) &
               call violation('TURN without u_n', act)
            turns = turns + 1
            call scribble()
         case (VLCC_REVERSE)
            if (turns == 0) call violation('REVERSE before TURN', act)
            if (act%to /= expect .or. act%from /= act%to + 1) &
               call violation('REVERSE out of order', act)
            if (.not. run_holds(act%to)) call violation('the regions do not hold u_i', act)
            expect = expect - 1
            reverses = reverses + 1
            call scribble()
         case (VLCC_DONE)
            exit
         case default
            call violation('an unknown kind', act)
         end select
      end do
      if (reverses /= n .or. expect /= -1) call violation('not every adjoint step', act)
      call check(vlcc_run_close(run), 'vlcc_run_close')
      if (c_associated_(run)) call violation('the closed handle was not reset', act)
      print '("ok: ", i0, " turn, ", i0, " adjoint steps")', turns, reverses
   end subroutine run_schedule

   logical function c_associated_(p)
      use, intrinsic :: iso_c_binding, only: c_associated
      type(c_ptr), intent(in) :: p
      c_associated_ = c_associated(p)
   end function c_associated_

   subroutine report(name, ierr)
      character(len=*), intent(in) :: name
      integer, intent(in) :: ierr
      character(len=:), allocatable :: message
      message = ''
      if (ierr /= 0) message = vlcc_last_error()
      print '(a, "|", i0, "|", i0, "|", a)', name, ierr, len(message), message
   end subroutine report

   subroutine bad_calls()
      type(c_ptr) :: run, closed
      type(vlcc_action) :: act
      real(real64), target :: strided(10), four(2, 2, 2, 2)
      character(len=VLCC_VERSION_SIZE) :: version
      integer :: ierr
      run = c_null_ptr
      call report('next_null', vlcc_run_next(run, act))
      call report('open_bad_json', vlcc_run_open(run, '{"schedule": '))
      call report('open_trailing_blanks', &
                  vlcc_run_open(run, '{"schedule": {"kind": "revolve", "steps": 3, "snapshots": 1}}   '))
      call report('protect_strided', vlcc_run_protect(run, 'v', strided(1:10:2)))
      call report('protect_rank_4', vlcc_run_protect(run, 'w', four))
      call report('protect_trailing_blank_name', vlcc_run_protect(run, 'u   ', u))
      call report('protect_twice', vlcc_run_protect(run, 'u', u))
      call report('protect_same_memory', vlcc_run_protect(run, 'v', u(2:3)))
      do
         ierr = vlcc_run_next(run, act)
         if (ierr /= 0 .or. act%kind == VLCC_DONE) exit
      end do
      call report('run_to_done', ierr)
      call report('next_after_done', vlcc_run_next(run, act))
      closed = run
      call report('close', vlcc_run_close(run))
      call report('close_closed', vlcc_run_close(closed))
      call report('next_closed', vlcc_run_next(closed, act))
      call report('history_commit_null', vlcc_history_commit(c_null_ptr, '', 'm', version))
      print '(a)', 'the end'
   end subroutine bad_calls

   subroutine commit(path, count)
      character(len=*), intent(in) :: path, count
      type(c_ptr) :: h
      character(len=VLCC_VERSION_SIZE) :: version
      integer(int64) :: k, n
      read (count, *) n
      call check(vlcc_history_open(h, path, 'w'), 'vlcc_history_open')
      call check(vlcc_history_protect(h, 'x', x), 'protect x')
      call check(vlcc_history_protect(h, 's', s), 'protect s')
      call check(vlcc_history_protect(h, 'ids', ids), 'protect ids')
      call check(vlcc_history_protect(h, 'm', m), 'protect m')
      do k = 0, n - 1
         call set_history(k)
         call check(vlcc_history_commit(h, '', 'from Fortran', version), 'vlcc_history_commit')
         print '("version ", i0, " ", a)', k, trim(version)
      end do
      call check(vlcc_history_close(h), 'vlcc_history_close')
   end subroutine commit

   subroutine checkout(path, ref)
      character(len=*), intent(in) :: path, ref
      type(c_ptr) :: h
      call check(vlcc_history_open(h, path, 'r'), 'vlcc_history_open')
      call check(vlcc_history_protect(h, 'x', x), 'protect x')
      call check(vlcc_history_protect(h, 's', s), 'protect s')
      call check(vlcc_history_protect(h, 'ids', ids), 'protect ids')
      call check(vlcc_history_protect(h, 'm', m), 'protect m')
      call check(vlcc_history_checkout(h, ref), 'vlcc_history_checkout')
      print '(4(i0, :, " "))', which(int(reshape(x, [24]), int64)), which([int(s, int64)]), &
         which(int(ids, int64)), which(reshape(m, [6]))
      call check(vlcc_history_close(h), 'vlcc_history_close')
   end subroutine checkout
end program regions
